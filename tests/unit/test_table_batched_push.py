"""One native pass over several tables (a step's update on a shard) against each table alone.

``update_stores`` steps the rows of several memory stores in one native call and
``push_tables`` applies a step's pushes through it: the result must be, bit for
bit, what each store's or table's own update gives, a refused table must leave
every table as it was, and each table keeps its own deduplication and counters.
"""

import dataclasses

import numpy as np
import pytest
import torch
from ember.kernels.id_index import IdIndex
from ember.kernels.upsert import upsert_row_updates
from ember.ps_server.shard.initializers import hashed_init
from ember.ps_server.shard.table import Table
from ember.ps_server.shard.table_passes import push_tables
from ember.ps_server.stores import memory
from ember.ps_server.stores.memory import InMemoryStore, update_stores
from ember.ps_server.wire.table_spec import InitializerSpec, InitKind, TableSpec

from tests.support.native import require_native
from tests.support.reference import OPTIMIZERS
from tests.unit.test_upsert_row_update import _assert_same, _bookkeeping, _contents

# Three tables that differ in every per-table argument: dim, optimizer and initializer.
SPECS = [
    TableSpec("a", dim=8, optimizer=OPTIMIZERS[3],
              initializer=InitializerSpec(InitKind.UNIFORM, scale=0.3, seed=5)),
    TableSpec("b", dim=4, optimizer=OPTIMIZERS[1], initializer=InitializerSpec(InitKind.ZEROS)),
    TableSpec("c", dim=8, optimizer=OPTIMIZERS[0],
              initializer=InitializerSpec(InitKind.UNIFORM, scale=0.1, seed=9)),
]  # fmt: skip


def _store(spec: TableSpec) -> InMemoryStore:
    from ember.kernels.optim import state_width

    return InMemoryStore(spec.dim, state_width(spec.optimizer.kind, spec.dim), capacity=16)


def _grads(rng: np.random.Generator, ids: np.ndarray, dim: int) -> torch.Tensor:
    return torch.from_numpy(rng.standard_normal((len(ids), dim)).astype(np.float32))


def test_several_stores_in_one_pass_equal_each_store_alone(monkeypatch):
    require_native()
    monkeypatch.setattr(memory, "rows_in_memory", lambda row_bytes: 1)  # arrays double: re-runs
    passes = []
    original = memory.upsert_row_updates
    monkeypatch.setattr(memory, "upsert_row_updates", lambda p: passes.append(1) or original(p))
    joined, alone = [_store(s) for s in SPECS], [_store(s) for s in SPECS]
    rng = np.random.default_rng(3)
    for step in range(12):
        updates = []
        for k, spec in enumerate(SPECS):  # tables grow at different steps
            ids = np.sort(rng.choice(100 * (k + 1) + 40 * step, size=30, replace=False))
            updates.append((ids.astype(np.int64), _grads(rng, ids, spec.dim)))
        update_stores(
            [(store, ids, grads, spec.optimizer, hashed_init(spec))
             for store, spec, (ids, grads) in zip(joined, SPECS, updates)]
        )  # fmt: skip
        for store, spec, (ids, grads) in zip(alone, SPECS, updates):
            store.update(ids, grads, spec.optimizer, create=_factory(spec, store))
        for a, b in zip(joined, alone):
            _assert_same(_contents(a), _contents(b))
            assert _bookkeeping(a) == _bookkeeping(b)
    assert len(passes) > 12  # some steps lacked room in one table and ran again


def _factory(spec: TableSpec, store: InMemoryStore):
    return Table(spec, store)._initial_rows


@pytest.mark.parametrize(
    "bad_ids, match",
    [([1, 500, 500], "twice"), ([1, -3], "must be >= 0")],
    ids=["repeated-absent-id", "negative-id"],
)
def test_a_refused_table_leaves_every_table_unchanged(bad_ids, match):
    require_native()
    stores = [_store(s) for s in SPECS[:2]]
    for store, spec in zip(stores, SPECS):
        store.update(np.arange(0, 40, dtype=np.int64), torch.ones(40, spec.dim), spec.optimizer,
                     create=_factory(spec, store))  # fmt: skip
    before = [(_contents(s), _bookkeeping(s)[:2]) for s in stores]
    good = np.array([3, 200, 201], dtype=np.int64)  # held and absent ids: it would be written
    bad = np.array(bad_ids, dtype=np.int64)
    with pytest.raises(RuntimeError, match=match):
        update_stores([
            (stores[0], good, torch.ones(3, 8), SPECS[0].optimizer, hashed_init(SPECS[0])),
            (stores[1], bad, torch.ones(len(bad), 4), SPECS[1].optimizer, hashed_init(SPECS[1])),
        ])  # fmt: skip
    for store, (contents, counts) in zip(stores, before):
        _assert_same(_contents(store), contents)
        assert _bookkeeping(store)[:2] == counts


class _RecordingLock:
    """A table's lock that records the order tables are locked in."""

    def __init__(self, name: str, order: list[str]) -> None:
        self._name, self._order, self._lock = name, order, __import__("threading").Lock()

    def __enter__(self):
        self._order.append(self._name)
        return self._lock.__enter__()

    def __exit__(self, *exc):
        return self._lock.__exit__(*exc)


def test_push_tables_equals_each_table_pushed_alone(monkeypatch):
    """Native and separate-op tables (a normal initializer has no native form), a table
    that already applied the request id (skipped, counted), locks in name order, the
    native tables in one pass."""
    require_native()
    passes = []
    original = memory.upsert_row_updates
    monkeypatch.setattr(
        memory, "upsert_row_updates", lambda p: passes.append(len(p)) or original(p)
    )
    specs = [*SPECS, TableSpec("d", dim=4, initializer=InitializerSpec(InitKind.NORMAL, scale=0.1))]
    batched, alone = [Table(s) for s in specs], [Table(s) for s in specs]
    order: list[str] = []
    for table in batched:
        table._lock = _RecordingLock(table.spec.name, order)
    rng = np.random.default_rng(5)
    for step in range(4):
        pushes = []
        for spec in specs:
            ids = np.sort(rng.choice(300, size=25, replace=False)).astype(np.int64)
            pushes.append((ids, _grads(rng, ids, spec.dim)))
        request = f"job@{step}"
        if step == 2:  # table b applied this request before (a retried step): skipped
            batched[1].push(*pushes[1], request, distinct=True)
            alone[1].push(*pushes[1], request, distinct=True)
        order.clear()
        passes.clear()
        push_tables([(t, ids, g) for t, (ids, g) in reversed(list(zip(batched, pushes)))], request)
        assert order == ["a", "b", "c", "d"]  # natives together in name order, then the other
        assert passes == [2 if step == 2 else 3]  # a, b and c in one pass (b: a duplicate)
        for table, (ids, grads) in zip(alone, pushes):
            table.push(ids, grads, request, distinct=True)
    for a, b in zip(batched, alone):
        _assert_same(_contents(a.store), _contents(b.store))
        assert a.counters == b.counters and a.applied_request_ids() == b.applied_request_ids()
        assert np.array_equal(a.changes.cut(), b.changes.cut())
    assert batched[1].counters.duplicate_pushes == 1
    assert not any(t._lock._lock.locked() for t in batched)


def test_push_tables_refuses_a_table_given_twice_and_holds_no_lock():
    table = Table(SPECS[0])
    ids = np.array([1], dtype=np.int64)
    with pytest.raises(ValueError, match="twice"):
        push_tables([(table, ids, torch.ones(1, 8)), (table, ids, torch.ones(1, 8))], "r")
    assert not table._lock.locked() and table.counters.push_requests == 0


class _FailingOnce:
    """A store (not a memory store: pushed alone) whose first update fails, as a cold tier
    whose connection drops would."""

    def __init__(self, inner: InMemoryStore) -> None:
        self._inner, self.failures = inner, 1

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def update(self, *args, **kwargs):
        if self.failures:
            self.failures -= 1
            raise ConnectionError("the store's connection dropped")
        return self._inner.update(*args, **kwargs)


def test_a_retry_after_a_failed_table_applies_every_table_once():
    """A table that fails leaves the tables already written remembered: the retry of the
    same request applies only what was not applied."""
    require_native()
    flaky_spec = TableSpec("b", dim=4, optimizer=OPTIMIZERS[1])
    tables = [Table(SPECS[0]), Table(flaky_spec, _FailingOnce(_store(flaky_spec)))]
    twins = [Table(SPECS[0]), Table(flaky_spec)]
    ids = np.array([1, 2, 3], dtype=np.int64)
    pushes = [(ids, torch.ones(3, 8)), (ids, torch.ones(3, 4))]
    with pytest.raises(ConnectionError):
        push_tables([(t, *p) for t, p in zip(tables, pushes)], "job@0")
    push_tables([(t, *p) for t, p in zip(tables, pushes)], "job@0")  # the retry
    for table, twin, push in zip(tables, twins, pushes):
        twin.push(*push, "job@0", distinct=True)
        _assert_same(_contents(table.store._inner if table is tables[1] else table.store),
                     _contents(twin.store))  # fmt: skip
        assert table.counters.rows_pushed == 3
    assert tables[0].counters.duplicate_pushes == 1


def test_tables_sharing_storage_are_refused_before_any_write():
    require_native()
    store, spec = _store(SPECS[1]), SPECS[1]
    store.update(np.arange(8, dtype=np.int64), torch.ones(8, 4), spec.optimizer,
                 create=_factory(spec, store))  # fmt: skip
    before = _contents(store)
    ids = torch.tensor([1, 50])
    part = store._upsert(ids, torch.ones(2, 4), spec.optimizer, hashed_init(spec))
    other = dataclasses.replace(part, index=IdIndex(16))  # another index over the same rows
    with pytest.raises(RuntimeError, match="share storage"):
        upsert_row_updates([part, other])
    _assert_same(_contents(store), before)
