"""Resident memory of the in-memory store against the raw bytes of its rows.

Fills one table of a shard's store with N rows (created by their first push)
in this fresh process and compares the growth of the resident set
with the raw bytes of rows plus optimizer state.

Usage: python benchmarks/store_memory.py [--rows 10000000] [--dim 64] [--optimizer sgd]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import psutil
import torch
from ember.kernels.optim import state_width
from ember.ps_server.shard.malloc_tuning import retain_freed_buffers
from ember.ps_server.shard.table import Table
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec


def measure(
    rows: int, dim: int, optimizer: OptimizerKind, chunk: int = 1 << 18
) -> dict[str, float]:
    """Fill a table with ``rows`` rows; returns raw bytes, RSS growth and the store's own count.

    Rows arrive in pushes of ``chunk`` ids: 2^18 is about the most one request carries
    under the default 64 MiB message limit at dim 64, so transient buffers are sized
    as a shard really sees them.
    """

    def push(ids: np.ndarray) -> None:
        table.push(ids, torch.zeros(len(ids), dim), request_id=f"fill-{ids[0]}")

    retain_freed_buffers()  # as a shard process does
    torch.set_num_threads(1)
    process = psutil.Process()
    spec = TableSpec("memory", dim, optimizer=OptimizerSpec(optimizer, lr=0.01))
    table = Table(spec)
    push(np.arange(16, dtype=np.int64))  # load the native ops before the baseline
    before = process.memory_info().rss
    for start in range(16, rows, chunk):
        push(np.arange(start, min(rows, start + chunk), dtype=np.int64))
    after = process.memory_info().rss
    raw = rows * 4 * (dim + state_width(optimizer, dim))
    return {
        "rows": rows,
        "raw_bytes": raw,
        "rss_growth": after - before,
        "store_bytes": table.store.nbytes,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument(
        "--optimizer", default="sgd", choices=[k.name.lower() for k in OptimizerKind]
    )
    args = parser.parse_args()
    result = measure(args.rows, args.dim, OptimizerKind[args.optimizer.upper()])
    raw = result["raw_bytes"]
    print(f"store memory: {args.rows} rows x dim {args.dim}, {args.optimizer}")
    print(f"  raw rows + optimizer state   {raw / 2**30:8.2f} GiB  ({raw / args.rows:6.1f} B/row)")
    print(
        f"  process RSS growth           {result['rss_growth'] / 2**30:8.2f} GiB  "
        f"({result['rss_growth'] / args.rows:6.1f} B/row)  ratio {result['rss_growth'] / raw:.3f}"
    )
    print(
        f"  store's own accounting       {result['store_bytes'] / 2**30:8.2f} GiB  "
        f"({result['store_bytes'] / args.rows:6.1f} B/row)  ratio {result['store_bytes'] / raw:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
