"""Ember's step calls over UCX and over gRPC, against ucxx's own send and receive, in one run.

Starts a 2-shard Ember cluster serving UCX beside gRPC, and 2 raw UCX bytes
servers (benchmarks/ucx_echo_server.py) the same way (LocalCluster, loopback).
For 1k, 16k and 128k distinct ids of one table (dim 64), it times a StepClient
Lookup and a clocked Update over UCX and over gRPC, and raw UCX calls that move
the same bytes each way: the Lookup's encoded request out and its rows back; the
Update's encoded request out and a short reply back; split over the two
servers in parallel, two messages each way as Ember's frames are. Rounds
alternate between the three; each figure is the median round. Prints rows/s
and the ratios Ember-UCX / raw UCX and Ember-gRPC / Ember-UCX.

UCX_TLS defaults to tcp and UCX_NET_DEVICES to lo here (set them to compare others).

Usage: python benchmarks/bench_ucx.py [--sizes 1024,16384,131072] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from bench_timing import time_per_op
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.client.step_client import StepClient
from ember.ps_server.client.step_job import StepJob
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.routing import positions_by_shard, shard_of
from ember.ps_server.shard.malloc_tuning import retain_freed_buffers
from ember.ps_server.ucx import load_ucx, ucx_loop
from ember.ps_server.wire.messages import encode_ids
from ember.ps_server.wire.step_codec import encode_lookup_request, encode_update_request
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec
from figures import Figures, add_json_flag
from table_rows import create_rows

UCX_ECHO_SERVER = Path(__file__).with_name("ucx_echo_server.py")
DIM = 64
TABLE_ROWS = 1 << 20
TABLE = "bench"
UPDATE_REPLY_BYTES = 16


class RawUcxClient:
    """Sends pre-built payloads to the raw UCX servers, all servers at once."""

    def __init__(self, endpoints: list[str]) -> None:
        self._ucx = load_ucx()
        self._loop = ucx_loop()
        self._endpoints = self._loop.run(self._connect(endpoints))

    async def _connect(self, endpoints: list[str]) -> list:
        hosts = [endpoint.rsplit(":", 1) for endpoint in endpoints]
        return [await self._ucx.create_endpoint(host, int(port)) for host, port in hosts]

    def call(self, requests: list[np.ndarray], reply_bytes: list[int]) -> None:
        """Each server gets its request and sends back its reply's bytes."""
        self._loop.run(self._call(requests, reply_bytes))

    async def _call(self, requests: list[np.ndarray], reply_bytes: list[int]) -> None:
        await asyncio.gather(
            *(self._exchange(e, r, n) for e, r, n in zip(self._endpoints, requests, reply_bytes))
        )

    async def _exchange(self, endpoint, request: np.ndarray, reply_bytes: int) -> None:
        await endpoint.send(np.array([len(request), reply_bytes], dtype="<u8"))
        await endpoint.send(request)
        sizes = np.empty(2, dtype="<u8")
        await endpoint.recv(sizes)
        await endpoint.recv(np.empty(reply_bytes, dtype=np.uint8))

    def close(self) -> None:
        """Close the endpoints."""
        self._loop.run(self._close())

    async def _close(self) -> None:
        await asyncio.gather(*(endpoint.close() for endpoint in self._endpoints))


def _as_array(payload: bytes) -> np.ndarray:
    return np.frombuffer(payload, dtype=np.uint8)


def bench_size(
    steps: dict[str, StepClient], raw: RawUcxClient, n: int, rounds: int, budget_s: float
) -> dict[str, float]:
    """Median seconds per call of each (transport, op) and of the raw calls, for ``n`` ids."""
    rng = np.random.default_rng(n)
    ids = rng.choice(TABLE_ROWS, n, replace=False).astype(np.int64)
    grads = rng.standard_normal((n, DIM), dtype=np.float32) * 1e-3
    shards = positions_by_shard(shard_of(TABLE, ids, 2), 2)
    lookups = [
        _as_array(encode_lookup_request([(TABLE, encode_ids(ids[p]))], None)) for p in shards
    ]
    updates = [
        _as_array(encode_update_request([(TABLE, encode_ids(ids[p]), grads[p])], None))
        for p in shards
    ]
    clocks = {name: iter(range(1 << 30)) for name in steps}
    operations: dict[str, Callable[[], object]] = {
        "raw lookup": lambda: raw.call(lookups, [len(p) * 4 * DIM for p in shards]),
        "raw update": lambda: raw.call(updates, [UPDATE_REPLY_BYTES] * 2),
    }
    for name, step in steps.items():
        operations[f"{name} lookup"] = lambda s=step: s.lookup({TABLE: ids})
        operations[f"{name} update"] = lambda s=step, c=clocks[name]: s.update(
            {TABLE: (ids, grads)}, next(c)
        )
    times: dict[str, list[float]] = {key: [] for key in operations}
    for _ in range(rounds):
        for key, operation in operations.items():
            times[key].append(time_per_op(operation, budget_s))
    return {key: statistics.median(values) for key, values in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,16384,131072")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=0.4, help="timing budget per round/op")
    add_json_flag(parser)
    args = parser.parse_args()
    figures = Figures()
    os.environ.setdefault("UCX_TLS", "tcp")
    os.environ.setdefault("UCX_NET_DEVICES", "lo")  # loopback only
    retain_freed_buffers()  # one client process serves every system: the same allocator
    spec = TableSpec(TABLE, DIM, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=0.01))
    echo_command = (sys.executable, str(UCX_ECHO_SERVER))
    with (
        LocalCluster(2, ["--ucx"]) as cluster,
        LocalCluster(2, server_command=echo_command) as echo,
    ):
        clients = {
            t: PSClient(cluster.endpoints, ClientConfig(transport=t)) for t in ("ucx", "grpc")
        }
        clients["grpc"].create_table(spec)
        create_rows(clients["grpc"], TABLE, TABLE_ROWS, DIM)
        steps = {
            t: StepClient(c, StepJob(f"bench-ucx-{t}-{os.getpid()}", mode="async"))
            for t, c in clients.items()
        }
        assert clients["ucx"].shard_rpc.data_plane.name == "ucx"
        raw = RawUcxClient(echo.endpoints)
        print(
            f"2 shards, dim {DIM}, one table, UCX_TLS={os.environ['UCX_TLS']}; "
            f"median of {args.rounds} rounds; rows/s"
        )
        print(
            f"{'ids':>7} {'op':>7} {'Ember UCX':>10} {'Ember gRPC':>10} {'raw UCX':>10} "
            f"{'UCX/raw':>8} {'gRPC/UCX':>8}"
        )
        for n in [int(s) for s in args.sizes.split(",")]:
            result = bench_size(steps, raw, n, args.rounds, args.budget_s)
            for op in ("lookup", "update"):
                ucx, grpc_, base = (result[f"{k} {op}"] for k in ("ucx", "grpc", "raw"))
                print(
                    f"{n:>7} {op:>7} {n / ucx:>10.0f} {n / grpc_:>10.0f} {n / base:>10.0f} "
                    f"{base / ucx:>8.2f} {ucx / grpc_:>8.2f}"
                )
                figures.add(f"{op} of {n:,} ids, Ember UCX / raw UCX", base / ucx, at_least=0.8)
        raw.close()
        for client in clients.values():
            client.close()
    figures.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
