"""The tiered store's own behaviour: LRU residency, write-back on eviction, failure atomicity."""

import threading

import numpy as np
import pytest
import torch
from ember.kernels.optim import state_width
from ember.ps_server.errors import StoreUnavailableError
from ember.ps_server.stores import RowBatch, open_store
from ember.ps_server.stores.redis_store import RedisStore
from ember.ps_server.stores.tiered import TieredStore
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec

from tests.support.redis_server import RedisServer, require_redis_server

DIM = 4
SGD = OptimizerSpec(OptimizerKind.SGD, lr=0.5)
WIDTH = state_width(SGD.kind, DIM)


def rows_for(ids: np.ndarray, value: float = 0.0) -> RowBatch:
    weights = torch.from_numpy(ids.astype(np.float32)).unsqueeze(1).repeat(1, DIM) + value
    return RowBatch(weights, torch.zeros(len(ids), WIDTH), torch.zeros(len(ids), dtype=torch.int64))


def tiered(url: str, table: str, capacity: int) -> tuple[TieredStore, RedisStore]:
    store = open_store(f"tiered+{url}?capacity={capacity}", table, 0, DIM, WIDTH)
    return store, RedisStore(url, table, 0, DIM, WIDTH)


def test_evicted_dirty_rows_are_written_back_and_clean_ones_are_not_rewritten(
    redis_server, table_name
):
    store, cold = tiered(redis_server.url, table_name, capacity=8)
    first = np.arange(8, dtype=np.int64)
    store.insert(first, rows_for(first))
    assert cold.size() == 0 and store.resident == 8  # dirty rows wait in memory
    store.update(first[:2], torch.ones(2, DIM), SGD)
    second = np.arange(100, 108, dtype=np.int64)
    store.insert(second, rows_for(second))  # evicts the first eight, writing them back
    assert store.resident <= 8 and cold.size() == 8
    found, written = cold.fetch(first)
    assert found.all()
    expected = rows_for(first).weights
    expected[:2] -= 0.5
    assert torch.equal(written.weights, expected)
    assert written.versions.tolist() == [1, 1, 0, 0, 0, 0, 0, 0]
    # Reading the first rows again admits them from Redis with the written-back values.
    assert torch.equal(store.fetch(first)[1].weights, expected)
    assert store.misses >= 8 and store.size() == 16


def test_recently_used_rows_stay_resident(redis_server, table_name):
    store, _ = tiered(redis_server.url, table_name, capacity=64)
    hot = np.arange(16, dtype=np.int64)
    store.insert(hot, rows_for(hot))
    for round_ in range(20):
        store.fetch(hot)  # touched every round, between batches of 40 rows seen once
        cold_ids = np.arange(1000 + 40 * round_, 1040 + 40 * round_, dtype=np.int64)
        store.insert(cold_ids, rows_for(cold_ids))
    hits_before = store.hits
    store.fetch(hot)
    assert store.hits - hits_before == len(hot)  # all served from memory


def test_flush_writes_dirty_rows_through_and_dump_sees_each_row_once(redis_server, table_name):
    store, cold = tiered(redis_server.url, table_name, capacity=32)
    ids = np.arange(50, dtype=np.int64)
    store.insert(ids, rows_for(ids))
    store.flush()
    assert cold.size() == 50
    assert torch.equal(cold.fetch(ids)[1].weights, rows_for(ids).weights)
    dumped = np.concatenate([chunk for chunk, _ in store.dump()])
    assert sorted(dumped.tolist()) == ids.tolist()


def test_redis_lost_during_admission_changes_nothing(tmp_path, table_name):
    require_redis_server()
    with RedisServer(tmp_path) as server:
        store, _ = tiered(server.url, table_name, capacity=4)
        resident = np.arange(4, dtype=np.int64)
        store.insert(resident, rows_for(resident))
        server.stop()
        with pytest.raises(StoreUnavailableError):
            store.update(np.arange(10, 14, dtype=np.int64), torch.ones(4, DIM), SGD)
        # The resident rows were neither dropped nor changed.
        assert store.resident == 4
        found, rows = store.fetch(resident)  # all hits: Redis is not asked
        assert found.all() and torch.equal(rows.weights, rows_for(resident).weights)


def test_concurrent_stats_pushes_and_evictions_lose_no_update(redis_server, table_name):
    """Stats walk the tier's slot arrays while pushes grow them and evict rows: after a
    flush, Redis holds every pushed row's value (a lost dirty flag leaves a stale row)."""
    from ember.ps_server.shard.initializers import initial_rows
    from ember.ps_server.shard.server import ParameterServer
    from ember.ps_server.wire.messages import encode_ids
    from ember.ps_server.wire.table_spec import TableSpec

    spec = TableSpec(table_name, dim=DIM, optimizer=SGD)
    server = ParameterServer(0, 1, store=f"tiered+{redis_server.url}?capacity=48")
    server.create_table(spec)
    owned = [np.arange(k * 1000, k * 1000 + 150, dtype=np.int64) for k in range(3)]
    sums = [np.zeros((150, DIM)) for _ in owned]
    done = threading.Event()

    def pusher(worker: int) -> None:
        rng = np.random.default_rng(worker)
        for step in range(60):
            picked = rng.choice(150, size=40, replace=False)
            grads = rng.standard_normal((40, DIM)).astype(np.float32)
            server.push(
                table_name, encode_ids(owned[worker][picked]), grads.tobytes(), f"{worker}:{step}"
            )
            sums[worker][picked] += grads

    def reader() -> None:
        while not done.is_set():
            server.stats()

    errors = []

    def recording(work, *args):
        try:
            work(*args)
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            errors.append(error)
            done.set()

    threads = [threading.Thread(target=recording, args=(pusher, w)) for w in range(3)]
    watcher = threading.Thread(target=recording, args=(reader,))
    watcher.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    done.set()
    watcher.join(60)
    assert errors == []
    server.flush()
    cold = RedisStore(redis_server.url, table_name, 0, DIM, WIDTH)
    for ids, total in zip(owned, sums):
        found, rows = cold.fetch(ids)
        assert found.all()
        expected = initial_rows(spec, ids).double().numpy() - SGD.lr * total
        np.testing.assert_allclose(rows.weights.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_footprint_reads_the_tier_under_its_lock_and_scans_redis_outside_it(
    redis_server, table_name
):
    store, cold = tiered(redis_server.url, table_name, capacity=8)
    store.insert(np.arange(4, dtype=np.int64), rows_for(np.arange(4, dtype=np.int64)))
    seen = {}
    hot_only, cold_footprint = store._hot_only, cold.footprint
    store._hot_only = lambda: seen.setdefault("tier", store._lock._is_owned()) and hot_only()
    store._cold.footprint = lambda: seen.setdefault("scan", store._lock._is_owned()) or (0, 0)
    assert store.footprint()[0] == 4 and cold_footprint() == (0, 0)
    assert seen == {"tier": True, "scan": False}
