"""One native gather over several tables (a step's lookup on a shard) against each alone.

``hash_gather_joined`` gathers the rows of several id maps into one flat buffer and
``read_tables`` reads a step's tables through it: the result must be, bit for bit,
what each table's own gather or read gives, a refused call must leave the buffer as it
was, and each table keeps its own counters and initial rows.
"""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
from ember.kernels.hash_map import hash_gather_joined, hash_gather_rows
from ember.kernels.hashed_init import ZEROS, HashedInit, initial_rows_at
from ember.kernels.id_index import IdIndex
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

NAN = float("nan")
UNIFORM = HashedInit(True, name_salt=-77, seed_key=12345, scale=0.25)


def _maps(rng: np.random.Generator, widths: list[int]):
    """Per width: an index, a source of that width (more rows than ids) and probe ids
    with absent ones and duplicates."""
    parts = []
    for width in widths:
        held = rng.choice(10_000, size=300, replace=False).astype(np.int64)
        index = IdIndex(capacity=16)
        index.insert(torch.from_numpy(held), torch.randperm(400)[:300])
        src = torch.randn(400, width)
        probe = np.concatenate([rng.choice(held, 200), rng.integers(10_000, 20_000, 30)])
        parts.append((index, src, torch.from_numpy(rng.permutation(probe))))
    return parts


def test_a_joined_gather_equals_each_maps_gather_and_leaves_the_gaps_alone():
    """Sources of three widths and two dtypes, at odd byte offsets with gaps between."""
    require_native()
    rng = np.random.default_rng(11)
    parts = _maps(rng, [4, 1, 16])
    parts[1] = (parts[1][0], parts[1][1].double(), parts[1][2])
    offsets, end = [], 0
    for gap, (_, src, ids) in zip([3, 5, 1], parts):
        offsets.append(end + gap)
        end = offsets[-1] + len(ids) * src.shape[1] * src.element_size()
    out = torch.full((end + 7,), 0xAB, dtype=torch.uint8)
    absent = hash_gather_joined(
        [index.buckets for index, _, _ in parts], [src for _, src, _ in parts],
        [ids for _, _, ids in parts], offsets, out,
    )  # fmt: skip
    expected = out.clone()
    for (index, src, ids), offset, positions in zip(parts, offsets, absent):
        rows = torch.full((len(ids), src.shape[1]), NAN, dtype=src.dtype)
        assert torch.equal(positions, hash_gather_rows(*index.buckets, src, ids, rows))
        assert len(positions) == 30
        row_bytes = src.shape[1] * src.element_size()
        present = torch.from_numpy(np.setdiff1d(np.arange(len(ids)), positions.numpy()))
        region = expected[offset : offset + len(ids) * row_bytes].view(len(ids), row_bytes)
        region[present] = rows[present].view(torch.uint8).view(-1, row_bytes)
    assert torch.equal(out, expected)  # absent rows and the gaps keep their bytes


def test_a_joined_gather_of_no_maps_or_no_ids_writes_nothing():
    require_native()
    out = torch.full((4,), 7, dtype=torch.uint8)
    assert hash_gather_joined([], [], [], [], out) == []
    index = IdIndex(capacity=16)
    empty = torch.empty(0, dtype=torch.int64)
    [absent] = hash_gather_joined([index.buckets], [torch.randn(3, 2)], [empty], [4], out)
    assert len(absent) == 0 and bool((out == 7).all())


def test_initial_rows_are_written_at_the_positions_as_each_table_says():
    """Zero bytes or the native uniform_rows' rows, at odd offsets (made aside, then
    copied); every other byte as it was."""
    require_native()
    ids = [torch.arange(100, 110), torch.arange(7, 12), torch.arange(50, 53)]
    positions = [torch.tensor([0, 4, 9]), torch.tensor([1]), torch.empty(0, dtype=torch.int64)]
    row_bytes = [12, 8, 20]  # float32 rows of 3; an int64 version; unused
    offsets = [1, 1 + 10 * 12, 1 + 10 * 12 + 5 * 8]
    out = torch.full((offsets[2] + 3 * 20,), 0xAB, dtype=torch.uint8)
    initial_rows_at(ids, positions, offsets, row_bytes, [UNIFORM, ZEROS, UNIFORM], out)
    expected = torch.full_like(out, 0xAB)
    made = torch.ops.ember.uniform_rows(ids[0][positions[0]], -77, 12345, 3, 0.25)
    first = expected[1 : 1 + 120].view(10, 12)
    first[positions[0]] = made.view(torch.uint8).view(3, 12)
    expected[offsets[1] + 8 : offsets[1] + 16] = 0
    assert torch.equal(out, expected)


@pytest.mark.parametrize(
    "case, match",
    [
        ("position-outside", "position 10 is outside its 10 ids"),
        ("past-end", "do not fit in out"),
        ("negative-offset", "do not fit in out"),
        ("uniform-not-floats", "uniform rows: float32"),
        ("negative-row-bytes", "rows of -8 bytes"),
        ("positions-not-int64", "positions must be a contiguous 1-D int64"),
        ("out-not-bytes", "uint8"),
        ("out-over-positions", "must not share the storage of table 1's ids or positions"),
        ("short-list", "one entry per table"),
    ],
)
def test_refused_initial_rows_write_nothing(case, match):
    """Each fault sits in the second table, after a first one that would have been written."""
    require_native()
    ids, positions = [torch.arange(5), torch.arange(10)], [torch.tensor([2]), torch.tensor([1])]
    offsets, row_bytes, inits = [0, 40], [8, 4], [ZEROS, UNIFORM]
    buffer = bytearray(b"\xab" * 80)
    out = torch.frombuffer(buffer, dtype=torch.uint8)
    if case == "position-outside":
        positions[1] = torch.tensor([3, 10])
    elif case == "past-end":
        offsets[1] = 41
    elif case == "negative-offset":
        offsets[1] = -4
    elif case == "uniform-not-floats":
        row_bytes[1] = 6
    elif case == "negative-row-bytes":
        row_bytes[1] = -8
    elif case == "positions-not-int64":
        positions[1] = positions[1].int()
    elif case == "out-not-bytes":
        out = torch.frombuffer(buffer, dtype=torch.int16)
    elif case == "out-over-positions":  # two tensors, two storages, one buffer
        positions[1] = torch.frombuffer(buffer, dtype=torch.int64, count=1, offset=40)
        positions[1].fill_(1)
    elif case == "short-list":
        inits = inits[:1]
    before = bytes(buffer)
    with pytest.raises(RuntimeError, match=match):
        initial_rows_at(ids, positions, offsets, row_bytes, inits, out)
    assert bytes(buffer) == before


def _two_maps():
    rng = np.random.default_rng(5)
    parts = _maps(rng, [4, 4])
    maps = [index.buckets for index, _, _ in parts]
    srcs = [src for _, src, _ in parts]
    ids = [ids for _, _, ids in parts]
    return maps, srcs, ids, len(ids[0]) * 16


@pytest.mark.parametrize(
    "case, match",
    [
        ("overlap", "start at byte"),
        ("past-end", "do not fit in out"),
        ("offset-past-end", "start at byte"),
        ("negative-offset", "start at byte"),
        ("out-not-bytes", "uint8"),
        ("alias", "must not share src's storage"),
        ("alias-keys", "must not share the storage of table 1's keys"),
        ("alias-buffer", "must not share src's storage"),
        ("short-list", "one entry per table"),
        ("slot-outside-src", "outside src's"),
        ("bad-ids", "contiguous 1-D int64"),
        ("too-wide", "too wide"),
    ],
)
def test_a_refused_joined_gather_leaves_out_untouched(case, match):
    """Each fault sits in the second map, after a first map that would have been written."""
    require_native()
    maps, srcs, ids, size = _two_maps()
    offsets = [0, size]
    out = torch.full((2 * size,), 0xAB, dtype=torch.uint8)
    if case == "overlap":
        offsets[1] = size - 1
    elif case == "past-end":
        offsets[1] = size + 1
    elif case == "offset-past-end":
        offsets[1] = 2 * size + 1
    elif case == "negative-offset":
        offsets = [0, -1]
    elif case == "out-not-bytes":
        out = torch.full((size // 2,), NAN)
    elif case == "alias":
        srcs[1] = out[: 400 * 16].view(torch.float32).view(400, 4)
    elif case == "alias-keys":
        out = maps[1][0].view(torch.uint8)
    elif case == "alias-buffer":  # two tensors, two storages, one buffer
        buffer = bytearray(2 * size)
        out = torch.frombuffer(buffer, dtype=torch.uint8)
        srcs[1] = torch.frombuffer(buffer, dtype=torch.float32).view(-1, 4)
    elif case == "short-list":
        ids = ids[:1]
    elif case == "slot-outside-src":
        srcs[1] = srcs[1][:10]
    elif case == "bad-ids":
        ids[1] = ids[1].int()
    elif case == "too-wide":
        srcs[1] = torch.empty(0, 2**61)
    before = out.clone()
    with pytest.raises(RuntimeError, match=match):
        hash_gather_joined(maps, srcs, ids, offsets, out)
    assert torch.equal(out.view(torch.uint8), before.view(torch.uint8))


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
