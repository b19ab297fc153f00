"""Parameter-server throughput against a raw gRPC bytes baseline, in one run.

Starts a 2-shard Ember cluster and a 2-server raw bytes service (benchmarks/
echo_server.py) the same way (LocalCluster, loopback, same message limits),
then for 1k, 16k and 128k distinct ids (dim 64) times Ember pull and push
against raw calls that carry the same payload bytes, split over the two
servers in parallel the way PSClient fans out. Rounds alternate between the
two systems; each figure is the median round. Prints rows/s, MB/s and the
Ember / raw ratios.

Usage: python benchmarks/bench_ps.py [--sizes 1024,16384,131072] [--rounds 5]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import torch
from ember.ps_server.client import PSClient
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.config import DEFAULT_MAX_MESSAGE_BYTES, message_size_options
from ember.ps_server.fanout import FanOut
from ember.ps_server.malloc_tuning import retain_freed_buffers
from ember.ps_server.table_spec import OptimizerKind, OptimizerSpec, TableSpec

ECHO_SERVER = Path(__file__).with_name("echo_server.py")
DIM = 64
TABLE_ROWS = 1 << 20


class RawBytesClient:
    """Calls the echo servers with pre-built payloads, fanned out like PSClient."""

    def __init__(self, endpoints: list[str]) -> None:
        options = message_size_options(DEFAULT_MAX_MESSAGE_BYTES)
        self._channels = [grpc.insecure_channel(e, options=options) for e in endpoints]
        self._pull = [c.unary_unary("/ember.bench.Echo/Pull") for c in self._channels]
        self._push = [c.unary_unary("/ember.bench.Echo/Push") for c in self._channels]

        self._fan_out = FanOut(max_workers=max(8, 2 * len(endpoints)))  # as PSClient

    def call(self, method: str, payloads: list[bytes]) -> None:
        stubs = self._pull if method == "pull" else self._push
        outcomes = self._fan_out.run(
            [functools.partial(s, p, timeout=60) for s, p in zip(stubs, payloads)]
        )
        for _, error in outcomes:
            if error is not None:
                raise error

    def close(self) -> None:
        self._fan_out.close()
        for channel in self._channels:
            channel.close()


def _time_per_op(operation: Callable[[], None], budget_s: float) -> float:
    operation()  # warm
    count, start = 0, time.perf_counter()
    while True:
        operation()
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= budget_s and count >= 3:
            return elapsed / count


def bench_size(
    client: PSClient, raw: RawBytesClient, n: int, rounds: int, budget_s: float
) -> dict[str, float]:
    rng = np.random.default_rng(n)
    ids = torch.from_numpy(rng.choice(TABLE_ROWS, n, replace=False).astype(np.int64))
    grads = torch.from_numpy(rng.standard_normal((n, DIM), dtype=np.float32) * 1e-3)
    halves = [n // 2, n - n // 2]
    pull_payloads = [bytes(8 * h) for h in halves]
    push_payloads = [bytes(h * (8 + 4 * DIM)) for h in halves]
    times: dict[str, list[float]] = {"pull": [], "raw_pull": [], "push": [], "raw_push": []}
    for _ in range(rounds):
        times["raw_pull"].append(_time_per_op(lambda: raw.call("pull", pull_payloads), budget_s))
        times["pull"].append(_time_per_op(lambda: client.pull("bench", ids), budget_s))
        times["raw_push"].append(_time_per_op(lambda: raw.call("push", push_payloads), budget_s))
        times["push"].append(_time_per_op(lambda: client.push("bench", ids, grads), budget_s))
    return {key: statistics.median(values) for key, values in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,16384,131072")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--budget-s", type=float, default=0.4, help="timing budget per round and op"
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    retain_freed_buffers()  # one client process serves both systems: same allocator for both
    spec = TableSpec("bench", DIM, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=0.01))
    echo_command = (sys.executable, str(ECHO_SERVER))
    with LocalCluster(2) as cluster, LocalCluster(2, server_command=echo_command) as echo:
        client, raw = PSClient(cluster.endpoints), RawBytesClient(echo.endpoints)
        client.create_table(spec)
        for start in range(0, TABLE_ROWS, 1 << 17):  # create every row before timing
            client.pull("bench", torch.arange(start, start + (1 << 17)))
        print(
            f"2 shards, dim {DIM}, table of {TABLE_ROWS} rows, SGD; median of {args.rounds} rounds"
        )
        header = f"{'ids':>7} {'op':>5} {'rows/s':>11} {'MB/s':>8} {'raw rows/s':>11} {'raw MB/s':>9} {'ratio':>6}"
        print(header)
        for n in sizes:
            result = bench_size(client, raw, n, args.rounds, args.budget_s)
            for op, row_bytes in (("pull", 4 * DIM + 8), ("push", 4 * DIM + 8)):
                ours, base = n / result[op], n / result[f"raw_{op}"]
                print(
                    f"{n:>7} {op:>5} {ours:>11.0f} {ours * row_bytes / 1e6:>8.1f} "
                    f"{base:>11.0f} {base * row_bytes / 1e6:>9.1f} {ours / base:>6.2f}"
                )
        client.close()
        raw.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
