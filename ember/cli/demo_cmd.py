"""``ember demo``: a local 2-shard cluster under a Zipf pull/push workload."""

from __future__ import annotations

import argparse
import time

import numpy as np

from ember.env import env_value


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``demo`` subcommand."""
    parser = commands.add_parser("demo", help="run a local cluster under a Zipf pull/push workload")
    parser.add_argument(
        "--shards", type=int, default=env_value("DEMO_SHARDS", 2), help="number of shards"
    )
    parser.add_argument(
        "--seconds", type=float, default=env_value("DEMO_SECONDS", 5.0), help="workload duration"
    )
    parser.add_argument("--batch", type=int, default=4096, help="samples per step")
    parser.add_argument(
        "--ids-per-sample", type=int, default=32, help="embedding lookups per sample"
    )
    parser.add_argument("--dim", type=int, default=64, help="embedding width")
    parser.add_argument("--num-ids", type=int, default=1_000_000, help="distinct ids in the table")
    parser.add_argument("--zipf", type=float, default=1.05, help="Zipf exponent of id popularity")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Start the cluster, drive pulls and pushes for ``--seconds``, print throughput."""
    from ember.ps_server.client import PSClient
    from ember.ps_server.cluster import LocalCluster
    from ember.ps_server.table_spec import OptimizerKind, OptimizerSpec, TableSpec
    from ember.trainer.zipf import ZipfSampler

    for name in ("shards", "batch", "ids_per_sample", "dim", "num_ids"):
        if getattr(args, name) < 1:
            raise SystemExit(f"ember demo: --{name.replace('_', '-')} must be >= 1")
    spec = TableSpec("demo", args.dim, optimizer=OptimizerSpec(OptimizerKind.ADAGRAD, lr=0.05))
    sampler = ZipfSampler(args.num_ids, args.zipf, seed=0)
    print(f"starting {args.shards} shards ...", flush=True)
    with LocalCluster(args.shards) as cluster, PSClient(cluster.endpoints) as client:
        print(f"shards: {' '.join(cluster.endpoints)}", flush=True)
        client.create_table(spec)
        steps = lookups = unique_rows = 0
        start = last_report = time.perf_counter()
        while (now := time.perf_counter()) - start < args.seconds:
            ids = sampler.sample(args.batch * args.ids_per_sample)
            unique_ids = np.unique(ids)
            rows = client.pull(spec.name, unique_ids)
            client.push(spec.name, unique_ids, 0.01 * rows)
            steps += 1
            lookups += len(ids)
            unique_rows += len(unique_ids)
            if now - last_report >= 1.0:
                _report(steps, lookups, unique_rows, args, time.perf_counter() - start)
                last_report = now
        elapsed = time.perf_counter() - start
        rows_held = sum(t.rows for s in client.stats() for t in s.tables)
    print("-" * 60)
    _report(steps, lookups, unique_rows, args, elapsed)
    print(f"rows created on the shards: {rows_held}; shards stopped cleanly", flush=True)
    return 0


def _report(
    steps: int, lookups: int, unique_rows: int, args: argparse.Namespace, elapsed: float
) -> None:
    row_bytes = 4 * args.dim
    print(
        f"{elapsed:6.1f} s  steps {steps:5d}  samples/s {steps * args.batch / elapsed:9.0f}  "
        f"lookups/s {lookups / elapsed:10.0f}  unique rows/s {unique_rows / elapsed:9.0f}  "
        f"pull+push MB/s {2 * unique_rows * row_bytes / elapsed / 1e6:7.1f}",
        flush=True,
    )
