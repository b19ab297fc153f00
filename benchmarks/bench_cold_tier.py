"""Cold tier and durability costs, one run, each against a baseline measured beside it.

1. Redis store vs raw redis-py on the same bytes (target >= 0.8), each Ember
   line being what a shard does for that request (its marker check included):
     pull:  RedisStore.fetch of n ids without optimizer state, as a shard pull
            (keys built, pipelined MGET, weights and versions decoded into
            tensors)  vs  pipelined MGET of the same keys, values left as bytes;
     push:  RedisStore.update of n rows, as a shard push (one MGET, decode,
            Adagrad step, encode, one MSET or MULTI/EXEC)  vs  pipelined MGET
            then pipelined MSET of the same keys and values;
     write: RedisStore.insert of n rows (as assign and restore)  vs  pipelined
            MSET of the same keys and values.
   The store packs MGET and MSET with numpy where redis-py packs argument by
   argument, so ratios above 1 are possible; the Redis server's own time is
   common to both.
2. Tiered store with a memory tier of 10% of the rows, Zipf-distributed pushes
   (an optimizer step per distinct id, rows created on first touch): hit rate
   and rows/s, against the same pushes on the plain Redis store and on the
   memory store.
3. Push throughput of a shard (in process, no RPC, memory store) with the
   write-ahead log at fsync ``interval`` and ``always``, against no log; one
   pushing thread, and four (where group commit shares fsyncs).
4. The cost of a push while 5M ids changed since the last checkpoint (tracked
   for the next incremental one), against a push while none did (target:
   within 1.5x). Both push the same number of new rows.

The process tunes malloc as a shard does (``retain_freed_buffers``), so large
transient buffers are reused rather than faulted in afresh per request.

Usage: python benchmarks/bench_cold_tier.py [--ids 16384] [--dim 64] [--rounds 7] [--tracked 5000000]
Needs a redis-server binary (scripts/setup-redis.sh installs one).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import redis
import torch
from bench_timing import paired_medians
from ember.ps_server.durability.shard_fault import ShardFault
from ember.ps_server.durability.write_log import WriteLog
from ember.ps_server.shard.malloc_tuning import retain_freed_buffers
from ember.ps_server.shard.server import ParameterServer
from ember.ps_server.shard.table import Table
from ember.ps_server.stores import open_marker, open_store
from ember.ps_server.stores.base import RowBatch
from ember.ps_server.stores.redis_marker import RedisShardMarker
from ember.ps_server.stores.redis_store import DEFAULT_BATCH_KEYS, RedisStore, row_key_prefix
from ember.ps_server.stores.row_codec import encode_rows
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec
from ember.trainer.data.synthetic import zipf_ranks
from figures import Figures, add_json_flag

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.redis_server import RedisServer

ADAGRAD = OptimizerSpec(OptimizerKind.ADAGRAD, lr=0.05)


def shard_marker(url: str) -> RedisShardMarker:
    """The marker a serving shard reads with every Redis pipeline (checked as in a shard)."""
    marker = open_marker(url, 0, 1, ShardFault())
    marker.start_serving()
    return marker


def redis_against_raw(figures: Figures, url: str, n: int, dim: int, rounds: int) -> None:
    """Section 1."""
    # Adagrad-sized state; the shard's marker rides along, as in a shard.
    store = RedisStore(url, "bench", 0, dim, state_width=dim, marker=shard_marker(url))
    ids = np.random.default_rng(0).permutation(1 << 24)[:n].astype(np.int64)
    rows = RowBatch(torch.randn(n, dim), torch.rand(n, dim), torch.zeros(n, dtype=torch.int64))
    store.insert(ids, rows)
    raw = redis.Redis.from_url(url)
    prefix = row_key_prefix("bench", 0)
    keys = [prefix + int(i).to_bytes(8, "little") for i in ids]  # built beforehand, untimed
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

    grads = torch.randn(n, dim)

    def raw_read_write() -> None:
        raw_get()
        raw_set()

    pull, raw_pull = paired_medians([lambda: store.fetch(ids, with_state=False), raw_get], rounds)
    push, raw_push = paired_medians(
        [lambda: store.update(ids, grads, ADAGRAD), raw_read_write], rounds
    )
    write, raw_write = paired_medians([lambda: store.insert(ids, rows), raw_set], rounds)
    print(f"\n1. redis store vs raw redis-py: {n:,} ids, dim {dim}, {len(values[0])} B per value")
    print(f"{'op':<6} {'store ms':>9} {'raw ms':>8} {'ratio':>6}")
    for name, ours, theirs in (
        ("pull", pull, raw_pull),
        ("push", push, raw_push),
        ("write", write, raw_write),
    ):
        print(f"{name:<6} {ours * 1e3:>9.1f} {theirs * 1e3:>8.1f} {theirs / ours:>6.2f}")
        bound = {"at_least": 0.8} if name in ("pull", "push") else {}
        figures.add(f"redis store {name} of {n:,} ids / raw redis-py", theirs / ours, **bound)


def tiered_on_zipf(
    figures: Figures, url: str, universe: int, batch: int, batches: int, dim: int
) -> None:
    """Section 2: the same Zipf push stream through tiered, redis and memory stores."""
    rng = np.random.default_rng(1)
    scramble = rng.permutation(universe).astype(np.int64)  # hot ids spread over the id space
    stream = [np.unique(scramble[zipf_ranks(rng, universe, 1.05, batch)]) for _ in range(batches)]
    grads = [torch.randn(len(ids), dim) for ids in stream]
    capacity = universe // 10
    spec = TableSpec("zipf", dim=dim, optimizer=ADAGRAD)

    def create(new_ids: np.ndarray) -> RowBatch:
        return RowBatch(
            torch.zeros(len(new_ids), dim),
            torch.zeros(len(new_ids), dim),
            torch.zeros(len(new_ids), dtype=torch.int64),
        )

    print(
        f"\n2. tiered store: {universe:,} ids, memory tier {capacity:,} rows (10%), "
        f"{batches} pushes of {batch:,} Zipf(1.05) ids ({sum(map(len, stream)):,} distinct per "
        f"push summed)"
    )
    print(f"{'store':<28} {'rows/s':>10} {'vs redis':>9} {'vs memory':>10} {'hit rate':>9}")
    results = {}
    for name, store_url in (
        ("memory", "memory"),
        ("redis", url),
        (f"tiered (capacity {capacity:,})", f"tiered+{url}?capacity={capacity}"),
    ):
        marker = None if store_url == "memory" else shard_marker(url)
        store = open_store(store_url, f"zipf{len(results)}", 0, dim, dim, marker=marker)
        warm = len(stream) // 4  # the first quarter fills the tier; timed: the rest
        for ids, g in zip(stream[:warm], grads[:warm]):
            store.update(ids, g, spec.optimizer, create=create)
        hits_before = getattr(store, "hits", 0), getattr(store, "misses", 0)
        rows = sum(len(ids) for ids in stream[warm:])
        start = time.perf_counter()
        for ids, g in zip(stream[warm:], grads[warm:]):
            store.update(ids, g, spec.optimizer, create=create)
        results[name] = rows / (time.perf_counter() - start)
        hit_rate = ""
        if hasattr(store, "hits"):
            hits, misses = store.hits - hits_before[0], store.misses - hits_before[1]
            hit_rate = f"{hits / (hits + misses):.3f}"
        store.clear()
        rate = results[name]
        print(
            f"{name:<28} {rate:>10,.0f} {rate / results['redis'] if 'redis' in results else 1:>9.2f} "
            f"{rate / results['memory']:>10.2f} {hit_rate:>9}"
        )
    figures.add(
        "tiered store (10% in memory) on Zipf pushes / redis store",
        results[name] / results["redis"],
    )


def write_log_cost(figures: Figures, dim: int, batch: int, pushes: int, rounds: int = 3) -> None:
    """Section 3: shard pushes without a log, and with it at both fsync policies.

    Modes alternate round by round; each figure is the median of ``rounds``.
    """
    rng = np.random.default_rng(2)
    requests = [
        (
            rng.integers(0, 1 << 20, batch).astype(np.int64).tobytes(),
            rng.standard_normal((batch, dim)).astype(np.float32).tobytes(),
        )
        for _ in range(pushes)
    ]
    print(
        f"\n3. shard pushes with the write-ahead log: {pushes} pushes of {batch:,} ids x dim {dim} "
        f"(Adagrad), {len(requests[0][1]) / 1e6:.1f} MB of gradients each, in process, "
        f"median of {rounds} alternating rounds"
    )
    print(f"{'log':<16} {'threads':>7} {'pushes/s':>9} {'MB/s':>7} {'vs no log':>9}")
    modes = ("none", "interval", "always")
    for threads in (1, 4):
        rates: dict[str, list[float]] = {mode: [] for mode in modes}
        for _ in range(rounds):
            for mode in modes:
                rates[mode].append(_logged_push_rate(mode, requests, dim, threads))
        baseline = statistics.median(rates["none"])
        for mode in modes:
            rate = statistics.median(rates[mode])
            mb = rate * len(requests[0][1]) / 1e6
            print(f"{mode:<16} {threads:>7} {rate:>9.1f} {mb:>7.1f} {rate / baseline:>9.2f}")
            if mode != "none":
                figures.add(
                    f"pushes with fsync {mode}, {threads} threads / no log", rate / baseline
                )


def _logged_push_rate(mode: str, requests: list, dim: int, threads: int) -> float:
    with tempfile.TemporaryDirectory() as directory:
        server = ParameterServer(0, 1)
        server.create_table(TableSpec("t", dim=dim, optimizer=ADAGRAD))
        if mode != "none":
            server.journal.log = WriteLog(Path(directory), 0, 1, fsync=mode)
            server.journal.log.open()
        try:
            return _pushes_per_second(server, requests, threads)
        finally:
            server.journal.close()


def _pushes_per_second(server: ParameterServer, requests: list, threads: int) -> float:
    def push(index: int) -> None:
        ids, grads = requests[index]
        server.push("t", ids, grads, f"r{index}")

    push(0)  # rows created, first-touch costs out of the timing
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(push, range(1, len(requests))))
    return (len(requests) - 1) / (time.perf_counter() - start)


def changed_ids_cost(figures: Figures, dim: int, batch: int, tracked: int, repeats: int) -> None:
    """Section 4: a push's median time with ``tracked`` changed ids held, against none held."""
    spec = TableSpec("tracked", dim=dim, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=0.1))
    tables = [Table(spec), Table(spec)]
    for table in tables:
        table.changes.cut()  # tracking starts, as at a first checkpoint
    elsewhere = 1 << 40  # ids changed earlier, none of which the timed pushes touch
    for start in range(0, tracked, 1 << 20):
        stop = min(tracked, start + (1 << 20))
        tables[1].changes.add(np.arange(elsewhere + start, elsewhere + stop, dtype=np.int64))
    grads = torch.randn(batch, dim)
    pushes = iter(range(1 << 30))

    def push(table: Table) -> None:
        n = next(pushes)  # new rows every push, in both runs
        table.push(np.arange(n * batch, (n + 1) * batch, dtype=np.int64), grads, f"r{n}")

    idle, busy = paired_medians([lambda: push(tables[0]), lambda: push(tables[1])], repeats)
    print(
        f"\n4. a push of {batch:,} new rows (dim {dim}, SGD) while ids changed since the last "
        f"checkpoint are tracked, median of {repeats} alternating pushes"
    )
    print(f"{'changed ids':<16} {'ms/push':>8} {'vs none':>8}")
    print(f"{'none':<16} {idle * 1e3:>8.2f} {1.0:>8.2f}")
    print(f"{tracked:<16,} {busy * 1e3:>8.2f} {busy / idle:>8.2f}")
    figures.add(f"push time with {tracked:,} changed ids tracked / none", busy / idle, at_most=1.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=16_384, help="ids per request in section 1")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--universe", type=int, default=500_000, help="distinct ids, section 2")
    parser.add_argument("--batches", type=int, default=80, help="pushes in section 2")
    parser.add_argument("--wal-pushes", type=int, default=60, help="pushes per run, section 3")
    parser.add_argument(
        "--tracked", type=int, default=5_000_000, help="changed ids held, section 4"
    )
    add_json_flag(parser)
    args = parser.parse_args()
    figures = Figures()
    torch.set_num_threads(1)  # as a shard runs
    retain_freed_buffers()
    with tempfile.TemporaryDirectory() as directory, RedisServer(Path(directory)) as server:
        redis_against_raw(figures, server.url, args.ids, args.dim, args.rounds)
        tiered_on_zipf(figures, server.url, args.universe, 16_384, args.batches, args.dim)
    write_log_cost(figures, args.dim, 4096, args.wal_pushes)
    changed_ids_cost(figures, 16, 4096, args.tracked, 4 * args.rounds + 1)
    figures.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
