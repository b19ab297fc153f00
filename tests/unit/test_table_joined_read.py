"""A step's reads of several tables in one native pass against each table alone.

``read_tables`` and ``read_table_states`` read a step's tables through the joined ops
(tests/unit/test_kernel_gather_joined.py): the result must be, bit for bit, what each
table's own read gives, and each table keeps its own counters, initial rows and locks.
"""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
from ember.kernels.loader import reference_backend
from ember.kernels.optim import state_width
from ember.ps_server.shard import table_passes
from ember.ps_server.shard.initializers import initial_rows
from ember.ps_server.shard.table import Table
from ember.ps_server.shard.table_passes import (
    read_table_states,
    read_tables,
    state_answer_bytes,
)
from ember.ps_server.stores.memory import InMemoryStore
from ember.ps_server.wire.table_spec import InitializerSpec, InitKind, TableSpec

from tests.support.native import require_native
from tests.support.reference import OPTIMIZERS

SPECS = [
    TableSpec(
        "b",
        dim=4,
        optimizer=OPTIMIZERS[3],
        initializer=InitializerSpec(InitKind.UNIFORM, scale=0.5, seed=3),
    ),
    TableSpec(
        "a", dim=2, optimizer=OPTIMIZERS[0], initializer=InitializerSpec(InitKind.NORMAL, scale=0.1)
    ),
    TableSpec("c", dim=3, optimizer=OPTIMIZERS[1], initializer=InitializerSpec(InitKind.ZEROS)),
    TableSpec("d", dim=5, optimizer=OPTIMIZERS[2]),
]  # fmt: skip  (in memory: Adam, uniform rows made natively; SGD, no state, normal rows made
#   in Python; Adagrad, zero rows made natively. Read alone: row-wise Adagrad, uniform rows)


class _SeparateStore(InMemoryStore):
    """A memory store's subclass: read alone, as a Redis tier is."""


class _RecordingLock:
    """A table's lock that records the order tables are locked in."""

    def __init__(self, name: str, order: list[str]) -> None:
        self._name, self._order, self._lock = name, order, threading.Lock()

    def __enter__(self):
        self._order.append(self._name)
        return self._lock.__enter__()

    def __exit__(self, *exc):
        return self._lock.__exit__(*exc)


def _tables(order: list[str]) -> list[Table]:
    """Tables b, a, c (in memory) and d (read alone), each holding some rows stepped once
    or twice, locks recorded."""
    separate = _SeparateStore(5, state_width(SPECS[3].optimizer.kind, 5))
    tables = [Table(SPECS[0]), Table(SPECS[1]), Table(SPECS[2]), Table(SPECS[3], separate)]
    for table in tables:
        for step, ids in enumerate([np.arange(0, 60, 2), np.arange(0, 60, 6)]):
            grads = torch.full((len(ids), table.spec.dim), 0.5 + step)
            table.push(ids.astype(np.int64), grads, f"seed-{step}")
        table._lock = _RecordingLock(table.spec.name, order)
    return tables


def _joined_reads(tables: list[Table]) -> list[tuple[Table, np.ndarray]]:
    """b, a, c, d, b again, a and d with no ids: held and absent ids, duplicates."""
    rng = np.random.default_rng(2)
    picks = [0, 1, 2, 3, 0, 1, 3]
    return [(tables[k], rng.integers(0, 90, size=0 if i > 4 else 40)) for i, k in enumerate(picks)]


def _bytes(*arrays: np.ndarray) -> bytes:
    return b"".join(array.tobytes() for array in arrays)


def _twin_of(tables: list[Table], twins: list[Table], table: Table) -> Table:
    return twins[tables.index(table)]


def _locks_held_in(monkeypatch, function: str, tables: list[Table]) -> list[list[str]]:
    """The names of the tables whose locks are held at each call of ``table_passes``'
    ``function`` (recorded from then on)."""
    calls: list[list[str]] = []
    original = getattr(table_passes, function)

    def recording(*args):
        calls.append([t.spec.name for t in tables if t._lock._lock.locked()])
        return original(*args)

    monkeypatch.setattr(table_passes, function, recording)
    return calls


@pytest.mark.parametrize("skew", [0, 1, 3])  # the rows start at any alignment
def test_read_tables_equals_each_tables_read_weights(backend, skew, monkeypatch):
    """Native and separate tables (every table separate on the reference backend), a table
    read twice, absent ids (initial rows of every kind) and empty reads (not counted): the
    same bytes and counters as reading each alone, the native tables' locks held together
    in name order."""
    order: list[str] = []
    tables, twins = _tables(order), _tables([])
    reads = _joined_reads(tables)
    expected = _bytes(
        *(_twin_of(tables, twins, t).read_weights(ids).numpy() for t, ids in reads if len(ids))
    )
    held = _locks_held_in(monkeypatch, "fetch_weights_joined", tables)
    made_while = _locks_held_in(monkeypatch, "initial_rows_at", tables)
    out = torch.full((len(expected) + skew,), 0xAB, dtype=torch.uint8)
    read_tables(reads, out[skew:])
    assert bytes(out[skew:].numpy()) == expected and bool((out[:skew] == 0xAB).all())
    native = backend == "native"
    assert order == (["a", "b", "c", "d"] if native else ["b", "a", "c", "d", "b"])
    assert held == ([["b", "a", "c"]] if native else [])  # at once, in the one pass
    assert made_while == ([[]] if native else [])  # b's and c's absent rows: no lock held
    for table, twin in zip(tables, twins):
        assert table.counters == twin.counters
    assert not any(table._lock._lock.locked() for table in tables)


def test_read_tables_makes_initial_rows_for_ids_never_written(backend):
    table = Table(SPECS[0])
    ids = np.array([5, 7, 5], dtype=np.int64)
    out = torch.zeros(48, dtype=torch.uint8)
    read_tables([(table, ids)], out)
    rows = torch.from_numpy(out.numpy().view(np.float32)).view(3, 4)
    assert torch.equal(rows, Table(SPECS[0]).read_weights(ids))
    assert not torch.equal(rows[0], rows[1]) and bool((rows != 0).all())


@pytest.mark.parametrize("skew", [0, 2])
def test_read_table_states_equals_each_tables_read_state(backend, skew):
    """Versions, then state, per read: Adam's two moments, SGD's none, Adagrad's and a
    separate row-wise Adagrad table's; absent ids read version 0 and zero state; not
    counted as reads."""
    order: list[str] = []
    tables, twins = _tables(order), _tables([])
    reads = _joined_reads(tables)
    parts = []
    for table, ids in reads:
        state = torch.empty(len(ids), table.store.state_width)
        versions = _twin_of(tables, twins, table).read_state(ids, state)
        parts += [versions.numpy(), state.numpy()]
    expected = _bytes(*parts)
    counters = [table.counters for table in tables]
    out = torch.full((len(expected) + skew,), 0xAB, dtype=torch.uint8)
    read_table_states(reads, out[skew:])
    assert bytes(out[skew:].numpy()) == expected and bool((out[:skew] == 0xAB).all())
    assert order == (["a", "b", "c", "d"] if backend == "native" else ["b", "a", "c", "d", "b"])
    assert [table.counters for table in tables] == counters
    assert not any(table._lock._lock.locked() for table in tables)
    versions = np.frombuffer(bytes(out[skew : skew + 8 * 40].numpy()), np.int64)  # b's
    assert set(versions.tolist()) == {0, 1, 2}  # absent, stepped once, twice


@pytest.mark.parametrize("read", [read_tables, read_table_states])
def test_an_answer_buffer_of_another_size_is_refused_before_anything_is_written(read):
    tables = _tables([])
    reads = _joined_reads(tables)[:2]
    out = torch.full((10_000,), 0xAB, dtype=torch.uint8)
    with pytest.raises(ValueError, match="flat uint8 tensor of the answer's"):
        read(reads, out)
    assert bool((out == 0xAB).all())


def test_a_shard_without_the_native_ops_answers_a_joined_lookup():
    """EMBER_KERNELS=reference: the op library is not even loaded; every table is read
    alone (a joined native call would find no op)."""
    script = (
        "import numpy as np, torch;"
        "from ember.ps_server.shard.table import Table;"
        "from ember.ps_server.shard.table_passes import read_tables;"
        "from ember.ps_server.wire.table_spec import TableSpec;"
        "t = Table(TableSpec('t', dim=2)); ids = np.array([1, 2], np.int64);"
        "out = torch.zeros(16, dtype=torch.uint8); read_tables([(t, ids)], out);"
        "assert torch.equal(out.view(torch.float32).view(2, 2), t.read_weights(ids));"
        "import torch.ops; print(hasattr(torch.ops.ember, 'hash_gather_joined'))"
    )
    env = {**os.environ, "EMBER_KERNELS": "reference"}
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("kind", list(InitKind))
def test_initial_rows_read_natively_are_the_references_bit_for_bit(kind):
    """Ids never written, read through the joined pass, against the pure numpy/torch rule
    (``initial_rows`` with the reference backend): every initializer, zero's sign included."""
    require_native()
    spec = TableSpec("t", dim=7, initializer=InitializerSpec(kind, scale=0.3, seed=11))
    ids = np.array([0, 5, 2**63 - 1, 123_456_789], dtype=np.int64)
    out = torch.full((len(ids) * 7 * 4,), 0xAB, dtype=torch.uint8)
    read_tables([(Table(spec), ids)], out)
    with reference_backend():
        expected = initial_rows(spec, ids)
    assert bytes(out.numpy()) == expected.numpy().tobytes()


def test_a_state_read_ending_in_a_stateless_table_with_absent_ids():
    """SGD keeps no state: the answer's last rows are its versions alone (absent: 0)."""
    require_native()
    tables, twins = _tables([]), _tables([])
    ids = np.array([95, 2, 97], dtype=np.int64)  # 95 and 97 never written
    reads = [(tables[0], ids), (tables[1], ids)]
    out = torch.full((state_answer_bytes(tables[0], 3) + 3 * 8,), 0xAB, dtype=torch.uint8)
    read_table_states(reads, out)
    parts = []
    for table, twin in zip(tables[:2], twins[:2]):
        state = torch.empty(3, table.store.state_width)
        parts += [twin.read_state(ids, state).numpy(), state.numpy()]
    assert bytes(out.numpy()) == _bytes(*parts)
