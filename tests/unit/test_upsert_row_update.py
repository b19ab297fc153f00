"""The native upsert-and-step of a push against the separate ops it replaces.

A memory store steps a push's rows in one native pass when its row factory has
the native form of the initializer (``InitialRows.hashed``); otherwise it makes
absent rows, claims slots and steps them with separate ops. Both must leave the
same bits, the same slots and the same bookkeeping, and a refused push must leave
the store as it was.
"""

import dataclasses
import functools

import numpy as np
import pytest
import torch
from ember.kernels.upsert import TableUpsert, upsert_row_updates
from ember.ps_server.shard.initializers import hashed_init, initial_rows
from ember.ps_server.stores import memory
from ember.ps_server.stores.base import InitialRows
from ember.ps_server.stores.memory import InMemoryStore
from ember.ps_server.wire.table_spec import InitializerSpec, InitKind, OptimizerSpec, TableSpec

from tests.support.native import require_native
from tests.support.reference import OPTIMIZERS

DIM = 8
INITS = [InitializerSpec(InitKind.UNIFORM, scale=0.3, seed=5), InitializerSpec(InitKind.ZEROS)]


def _factories(spec: TableSpec, width: int) -> tuple[InitialRows, InitialRows]:
    """The native form (hashed) and the separate-ops form of the same initial rows."""
    weights = functools.partial(initial_rows, spec)
    return InitialRows(weights, width, hashed_init(spec)), InitialRows(weights, width)


def _contents(store: InMemoryStore) -> tuple:
    """Everything a store holds, independent of its buckets' layout."""
    ids, slots = store.items()
    order = torch.argsort(ids)
    ids, slots = ids[order], slots[order]
    _, rows = store.fetch(ids.numpy())
    return (ids, slots, rows.weights, rows.state, rows.versions, store.size(), store.slot_count)


def _assert_same(a: tuple, b: tuple) -> None:
    for x, y in zip(a[:5], b[:5], strict=True):
        assert torch.equal(x, y)
    assert a[5:] == b[5:]


def _bookkeeping(store: InMemoryStore) -> tuple:
    """What the store and its index count, and their buckets' layout."""
    index = store._index
    ids, slots = index.items()  # bucket order: equal where the index grew alike
    return (
        store._free.tolist(),
        len(index),
        index._used,
        index.nbytes,
        ids.tolist(),
        slots.tolist(),
    )


@pytest.mark.parametrize("arrays", ["reserved", "doubling"])
@pytest.mark.parametrize("init", INITS, ids=lambda i: i.kind.name.lower())
@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda s: s.kind.name.lower())
def test_one_pass_equals_the_separate_ops_bit_for_bit(init, optimizer, arrays, monkeypatch):
    require_native()
    if arrays == "doubling":  # no reservation: the arrays double, so a pass can lack rows
        monkeypatch.setattr(memory, "rows_in_memory", lambda row_bytes: 1)
    passes = []
    monkeypatch.setattr(
        memory, "upsert_row_updates", lambda parts: passes.append(1) or upsert_row_updates(parts)
    )
    spec = TableSpec("clicks", dim=DIM, optimizer=optimizer, initializer=init)
    native_store, separate_store = (
        InMemoryStore(DIM, _width(optimizer), capacity=16) for _ in "ab"
    )
    native, separate = _factories(spec, native_store.state_width)
    made_in_python = []  # the one-pass path makes its rows natively, never by the factory
    native = dataclasses.replace(native, weights=lambda ids: made_in_python.append(ids) or 1 / 0)
    rng = np.random.default_rng(7)
    held = np.empty(0, dtype=np.int64)
    for step in range(16):
        # Mixed new and held ids with growth past the initial capacity; from step 4 on
        # evictions, so later pushes reuse free slots (the tail of the free stack first),
        # some with fewer new ids than free slots; a push of held ids only; an empty push.
        if step == 10:
            ids = np.sort(rng.choice(held, size=30, replace=False))
        elif step == 11:
            ids = np.empty(0, dtype=np.int64)
        elif step >= 12:
            fresh = np.setdiff1d(np.arange(400, 420), held)[:3]
            ids = np.union1d(rng.choice(held, size=20, replace=False), fresh)
        else:
            ids = np.sort(rng.choice(400, size=60, replace=False))
        ids = ids.astype(np.int64)
        grads = torch.from_numpy(rng.standard_normal((len(ids), DIM)).astype(np.float32))
        native_store.update(ids, grads, optimizer, create=native)
        separate_store.update(ids, grads, optimizer, create=separate)
        held = np.union1d(held, ids)
        if 4 <= step < 12:
            gone = rng.choice(held, size=15, replace=False)
            native_store.evict(gone)
            separate_store.evict(gone)
            held = np.setdiff1d(held, gone)
        _assert_same(_contents(native_store), _contents(separate_store))
        assert _bookkeeping(native_store) == _bookkeeping(separate_store)
        assert len(native_store._weights) == len(separate_store._weights)  # grown alike
    assert not made_in_python and len(passes) >= 16  # every push took the one pass
    if arrays == "doubling":  # some pushes lacked rows and ran again after growing
        assert len(passes) > 16
    assert native_store.size() == len(held) > 60 and native_store.slot_count > 16


def _width(optimizer: OptimizerSpec) -> int:
    from ember.kernels.optim import state_width

    return state_width(optimizer.kind, DIM)


def _store_with_rows() -> tuple[InMemoryStore, InitialRows, OptimizerSpec]:
    optimizer = OPTIMIZERS[3]  # Adam: state and versions both matter
    spec = TableSpec("t", dim=DIM, optimizer=optimizer, initializer=INITS[0])
    store = InMemoryStore(DIM, _width(optimizer), capacity=16)
    native, _ = _factories(spec, store.state_width)
    store.update(np.arange(0, 40, 2, dtype=np.int64), torch.ones(20, DIM), optimizer, native)
    store.evict(np.array([4, 8], dtype=np.int64))  # two free slots
    return store, native, optimizer


@pytest.mark.parametrize(
    "ids, grads, error, match",
    [
        ([1, 3, -5], (3, DIM), RuntimeError, "must be >= 0"),
        ([1, 7, 7], (3, DIM), RuntimeError, "twice in ids"),  # inserted ones undone
        ([1, 3], (3, DIM), RuntimeError, "grads must have shape"),
        ([1, 3], (2, DIM + 1), RuntimeError, "grads must have shape"),
    ],
    ids=["negative-id", "repeated-new-id", "grads-rows", "grads-width"],
)
def test_a_refused_push_changes_nothing(ids, grads, error, match):
    require_native()
    store, native, optimizer = _store_with_rows()
    before, counts = _contents(store), _bookkeeping(store)[:2]
    with pytest.raises(error, match=match):
        store.update(np.array(ids, dtype=np.int64), torch.ones(grads), optimizer, native)
    _assert_same(_contents(store), before)
    assert _bookkeeping(store)[:2] == counts  # free stack and index size (it may rehash)
    # and the store still works: the same push without the fault is applied
    store.update(np.array([1, 3], dtype=np.int64), torch.ones(2, DIM), optimizer, native)
    assert store.size() == before[5] + 2


def test_absent_rows_without_room_are_not_written_and_the_index_is_sized():
    require_native()
    store, _, optimizer = _store_with_rows()
    before, index = _contents(store), store._index
    rows = (store._weights, store._state, store._versions)
    next_slot = len(store._weights) - 1  # one row left, three needed (no free slots given)
    ids = torch.tensor([1, 3, 5])
    answer = upsert_row_updates([
        TableUpsert(
            index, rows, ids, torch.ones(3, DIM), torch.empty(0, dtype=torch.int64), next_slot,
            hashed_init(TableSpec("t", dim=DIM)), optimizer,
        )
    ])  # fmt: skip
    assert answer == ([(3, 0)], False)
    _assert_same(_contents(store), before)
    assert len(index) == before[5] and index._used + 3 <= len(index._keys) * index.MAX_LOAD


def test_without_native_initial_rows_the_store_uses_the_separate_ops(monkeypatch):
    """A normal initializer has no native form: the store calls the factory for new rows."""
    spec = TableSpec("t", dim=DIM, initializer=InitializerSpec(InitKind.NORMAL, scale=0.1))
    made = []
    factory = InitialRows(lambda ids: made.append(ids.tolist()) or initial_rows(spec, ids), 0)
    assert hashed_init(spec) is None and factory.hashed is None
    store = InMemoryStore(DIM, 0)
    store.update(np.array([2, 9], dtype=np.int64), torch.zeros(2, DIM), spec.optimizer, factory)
    assert made == [[2, 9]]
    _, rows = store.fetch(np.array([2, 9], dtype=np.int64))
    assert torch.equal(rows.weights, initial_rows(spec, np.array([2, 9], dtype=np.int64)))
