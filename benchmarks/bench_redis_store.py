"""RedisStore against raw redis-py on the same bytes, one run, one redis-server.

  pull: RedisStore.fetch of n ids (keys built, pipelined MGET, values decoded
        into weight / state / version tensors)  vs  pipelined MGET of the same
        keys through redis-py, values left as bytes;
  push: RedisStore.insert of n rows (encoded, MULTI/EXEC of MSETs)  vs
        pipelined MSET of the same keys and values.
Ratios above 1 are impossible by construction; the target is >= 0.8.

Usage: python benchmarks/bench_redis_store.py [--ids 16384] [--dim 64] [--rounds 7]
Needs a redis-server binary (scripts/setup-redis.sh installs one).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import redis
import torch
from bench_timing import paired_medians
from ember.ps_server.stores.base import RowBatch
from ember.ps_server.stores.redis_store import DEFAULT_BATCH_KEYS, RedisStore
from ember.ps_server.stores.row_codec import encode_rows

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.redis_server import RedisServer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=16_384)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    n, dim = args.ids, args.dim
    with tempfile.TemporaryDirectory() as directory, RedisServer(Path(directory)) as server:
        store = RedisStore(server.url, "bench", 0, dim, state_width=dim)  # Adagrad-sized state
        ids = np.random.default_rng(0).permutation(1 << 24)[:n].astype(np.int64)
        rows = RowBatch(torch.randn(n, dim), torch.rand(n, dim), torch.zeros(n, dtype=torch.int64))
        store.insert(ids, rows)
        raw = redis.Redis.from_url(server.url)
        keys = store._keys(ids)
        values = encode_rows(rows)

        batch = DEFAULT_BATCH_KEYS  # the same commands as the store sends

        def raw_get() -> None:
            with raw.pipeline(transaction=False) as pipe:
                for start in range(0, n, batch):
                    pipe.mget(keys[start : start + batch])
                pipe.execute()

        def raw_set() -> None:
            with raw.pipeline(transaction=False) as pipe:
                for start in range(0, n, batch):
                    pipe.mset(dict(zip(keys[start : start + batch], values[start : start + batch])))
                pipe.execute()

        pull, raw_pull = paired_medians([lambda: store.fetch(ids), raw_get], args.rounds)
        push, raw_push = paired_medians([lambda: store.insert(ids, rows), raw_set], args.rounds)
        value_mb = n * len(values[0]) / 1e6
        print(
            f"redis store vs raw redis-py: {n:,} ids, dim {dim}, state {dim}, {len(values[0])} B per value"
        )
        print(
            f"{'op':<6} {'store ms':>9} {'raw ms':>8} {'store MB/s':>11} {'raw MB/s':>9} {'ratio':>6}"
        )
        for name, ours, theirs in (("pull", pull, raw_pull), ("push", push, raw_push)):
            print(
                f"{name:<6} {ours * 1e3:>9.1f} {theirs * 1e3:>8.1f} {value_mb / ours:>11.1f} "
                f"{value_mb / theirs:>9.1f} {theirs / ours:>6.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
