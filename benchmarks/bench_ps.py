"""Parameter-server throughput against a raw gRPC bytes baseline, in one run.

Starts a 2-shard Ember cluster and a 2-server raw bytes service (benchmarks/
echo_server.py) the same way (LocalCluster, loopback, same message limits),
then for 1k, 16k and 128k distinct ids (dim 64) times Ember pull and push
against raw calls that carry the same payload bytes, split over the two
servers in parallel the way PSClient fans out. Rounds alternate between the
two systems; each figure is the median round. Prints rows/s, MB/s and the
Ember / raw ratios.

Then the training data path: a batched step Lookup (StepClient, every table of
a step in one request per shard, with a clock) of 26 tables of dim 16, ids
spread over the tables as one synthetic training batch spreads them, at 16k
and 128k ids per shard, against raw calls that send the same request bytes
and get back as many bytes as the rows' weights. Beside each it prints the
milliseconds of a lookup, of its shard calls alone (the same request bytes,
built beforehand, sent through PSClient's transport, the replies not placed:
the lookup less the client's own step work of routing, encoding and placing)
and of the raw calls, and the CPU milliseconds per lookup of the client
process and of both servers.

Usage: python benchmarks/bench_ps.py [--sizes 1024,16384,131072] [--step-sizes 16384,131072]
    [--rounds 5]
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
from bench_timing import process_cpu_seconds, time_per_op, timed_loop
from ember.kernels.dedup import unique_inverse
from ember.ps_server.client.fanout import FanOut
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.client.shard_rpc import fan_out_threads
from ember.ps_server.client.step_client import StepClient
from ember.ps_server.client.step_job import StepJob
from ember.ps_server.client.transport import ShardCall
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.routing import positions_by_shard, shard_of
from ember.ps_server.shard.malloc_tuning import retain_freed_buffers
from ember.ps_server.wire.messages import DEFAULT_MAX_MESSAGE_BYTES, message_size_options
from ember.ps_server.wire.step_codec import encode_lookup_request
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec
from ember.trainer.config import TrainConfig
from ember.trainer.train import synthetic_data
from figures import Figures, add_json_flag
from table_rows import create_rows

ECHO_SERVER = Path(__file__).with_name("echo_server.py")
DIM = 64
TABLE_ROWS = 1 << 20
STEP_DIM = 16  # the training benchmark's dim


class RawBytesClient:
    """Calls the echo servers with pre-built payloads, fanned out like PSClient."""

    def __init__(self, endpoints: list[str]) -> None:
        options = message_size_options(DEFAULT_MAX_MESSAGE_BYTES)
        self._channels = [grpc.insecure_channel(e, options=options) for e in endpoints]
        self._pull = [c.unary_unary("/ember.bench.Echo/Pull") for c in self._channels]
        self._push = [c.unary_unary("/ember.bench.Echo/Push") for c in self._channels]

        self._fan_out = FanOut(fan_out_threads(len(endpoints)))  # as PSClient
        self._rows = [c.unary_unary("/ember.bench.Echo/Rows") for c in self._channels]

    def call(self, method: str, payloads: list[bytes]) -> None:
        stubs = {"pull": self._pull, "push": self._push, "rows": self._rows}[method]
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
        times["raw_pull"].append(time_per_op(lambda: raw.call("pull", pull_payloads), budget_s))
        times["pull"].append(time_per_op(lambda: client.pull("bench", ids), budget_s))
        times["raw_push"].append(time_per_op(lambda: raw.call("push", push_payloads), budget_s))
        times["push"].append(time_per_op(lambda: client.push("bench", ids, grads), budget_s))
    return {key: statistics.median(values) for key, values in times.items()}


def _timed_with_cpu(
    operation: Callable[[], None], budget_s: float, server_pids: list[int]
) -> tuple[float, float, float]:
    """``(wall, client CPU, servers' CPU)`` seconds per operation."""
    servers_before, client_before = sum(map(process_cpu_seconds, server_pids)), time.process_time()
    elapsed, timed = timed_loop(operation, budget_s)
    count = timed + 1  # the CPU figures include the warm call
    client_cpu = (time.process_time() - client_before) / count
    servers_cpu = (sum(map(process_cpu_seconds, server_pids)) - servers_before) / count
    return elapsed / timed, client_cpu, servers_cpu


def step_tables(ids_per_shard: int, num_shards: int) -> dict[str, np.ndarray]:
    """``{table: distinct ids}`` of 26 tables, as many per table as one synthetic training
    batch has (scaled to ``ids_per_shard`` per shard)."""
    config = TrainConfig(endpoints=("unused:0",), max_cardinality=100_000)
    batch = synthetic_data(config).batch(1024, 0)
    counts = np.array([len(unique_inverse(f.values)[0]) for f in batch.sparse], dtype=np.float64)
    scaled = np.maximum(1, np.round(counts / counts.sum() * ids_per_shard * num_shards))
    rng = np.random.default_rng(ids_per_shard)
    return {
        f"step.f{n}": np.sort(rng.choice(1 << 24, int(count), replace=False)).astype(np.int64)
        for n, count in enumerate(scaled)
    }


def bench_step_lookup(
    client: PSClient, raw: RawBytesClient, ids_per_shard: int, rounds: int, budget_s: float,
    pids: tuple[list[int], list[int]],
) -> dict[str, tuple[float, float, float]]:  # fmt: skip
    """Median ``(wall, client CPU, servers' CPU)`` of a batched Lookup, of its shard calls alone
    (the same request bytes, built beforehand, through PSClient's transport, the replies not
    placed) and of raw calls."""
    tables = step_tables(ids_per_shard, client.num_shards)
    for table, ids in tables.items():  # every row exists, as in training
        client.create_table(TableSpec(table, STEP_DIM))
        client.push(table, ids, torch.zeros(len(ids), STEP_DIM))
    steps = StepClient(client, StepJob(f"bench-{ids_per_shard}"))
    steps.update({t: (ids[:1], torch.zeros(1, STEP_DIM)) for t, ids in tables.items()}, clock=0)
    requests = {t: torch.from_numpy(ids) for t, ids in tables.items()}
    payloads, calls = [], []  # the bytes Ember's lookup sends each shard, and its calls
    for shard in range(client.num_shards):
        parts = []
        for table, ids in tables.items():
            mine = positions_by_shard(shard_of(table, ids, client.num_shards), client.num_shards)
            if len(mine[shard]):  # as the lookup leaves out a table with no ids here
                parts.append((table, ids[mine[shard]].tobytes()))
        payloads.append(encode_lookup_request(parts, steps.job.clock(0), joined_rows=True))
        calls.append(ShardCall(shard, "Lookup", payloads[-1], steps.job.wait_s, len(parts), 0))
    ember_pids, raw_pids = pids
    times: dict[str, list[tuple[float, float, float]]] = {"lookup": [], "calls": [], "raw": []}
    for _ in range(rounds):
        times["raw"].append(_timed_with_cpu(lambda: raw.call("rows", payloads), budget_s, raw_pids))
        times["lookup"].append(
            _timed_with_cpu(lambda: steps.lookup(requests, clock=0), budget_s, ember_pids)
        )
        times["calls"].append(
            _timed_with_cpu(lambda: client.shard_rpc.run(calls), budget_s, ember_pids)
        )
    return {
        key: tuple(statistics.median(v[i] for v in values) for i in range(3))
        for key, values in times.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,16384,131072")
    parser.add_argument("--step-sizes", default="16384,131072", help="ids per shard")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--budget-s", type=float, default=0.4, help="timing budget per round and op"
    )
    add_json_flag(parser)
    args = parser.parse_args()
    figures = Figures()
    sizes = [int(s) for s in args.sizes.split(",")]
    retain_freed_buffers()  # one client process serves both systems: same allocator for both
    spec = TableSpec("bench", DIM, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=0.01))
    echo_command = (sys.executable, str(ECHO_SERVER))
    echo16_args = ["--dim", str(STEP_DIM)]
    with (
        LocalCluster(2) as cluster,
        LocalCluster(2, server_command=echo_command) as echo,
        LocalCluster(2, server_command=echo_command, extra_args=echo16_args) as echo16,
    ):
        client, raw = PSClient(cluster.endpoints), RawBytesClient(echo.endpoints)
        client.create_table(spec)
        create_rows(client, "bench", TABLE_ROWS, DIM)
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
                bound = {"at_least": 0.8} if op == "pull" else {}  # no target for push
                figures.add(f"{op} of {n:,} ids, Ember / raw gRPC echo", ours / base, **bound)
        raw.close()
        raw = RawBytesClient(echo16.endpoints)
        print(
            f"\nbatched step Lookup: 26 tables, dim {STEP_DIM}, ids spread as in a training "
            "batch; ms per lookup, per its shard calls alone and per raw calls; CPU ms per "
            "lookup: client process, both servers"
        )
        print(
            f"{'ids/shard':>9} {'rows/s':>11} {'raw rows/s':>11} {'ratio':>6} "
            f"{'ms: lookup':>10} {'calls':>6} {'raw':>6} "
            f"{'CPU client':>10} {'servers':>8} {'raw client':>10} {'servers':>8}"
        )
        pids = ([p.pid for p in cluster.processes], [p.pid for p in echo16.processes])
        for n in [int(s) for s in args.step_sizes.split(",")]:
            result = bench_step_lookup(client, raw, n, args.rounds, args.budget_s, pids)
            (wall, client_cpu, servers_cpu), (raw_wall, raw_client, raw_servers) = (
                result["lookup"], result["raw"]
            )  # fmt: skip
            rows, calls_wall = n * client.num_shards, result["calls"][0]
            print(
                f"{n:>9} {rows / wall:>11.0f} {rows / raw_wall:>11.0f} {raw_wall / wall:>6.2f} "
                f"{1e3 * wall:>10.2f} {1e3 * calls_wall:>6.2f} {1e3 * raw_wall:>6.2f} "
                f"{1e3 * client_cpu:>10.1f} {1e3 * servers_cpu:>8.1f} {1e3 * raw_client:>10.1f} "
                f"{1e3 * raw_servers:>8.1f}"
            )
            figures.add(
                f"step Lookup of {n:,} ids/shard, Ember / raw gRPC echo", raw_wall / wall,
                at_least=0.7,
            )  # fmt: skip
        client.close()
        raw.close()
    figures.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
