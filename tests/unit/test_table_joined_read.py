"""One native gather over several tables (a step's lookup on a shard) against each alone.

``hash_gather_joined`` gathers the rows of several id maps into one flat buffer and
``read_tables`` reads a step's tables through it: the result must be, bit for bit,
what each table's own gather or read gives, a refused call must leave the buffer as it
was, and each table keeps its own counters and initial rows.
"""

import threading

import numpy as np
import pytest
import torch
from ember.kernels.hash_map import hash_gather_joined, hash_gather_rows
from ember.kernels.id_index import IdIndex
from ember.kernels.optim import state_width
from ember.ps_server.shard.table import Table, read_tables
from ember.ps_server.stores.memory import InMemoryStore
from ember.ps_server.wire.table_spec import InitializerSpec, InitKind, TableSpec

from tests.support.native import require_native

NAN = float("nan")


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
    require_native()
    rng = np.random.default_rng(11)
    parts = _maps(rng, [4, 1, 16])
    offsets, end = [], 0
    for gap, (_, src, ids) in zip([0, 5, 3], parts):
        offsets.append(end + gap)
        end = offsets[-1] + len(ids) * src.shape[1]
    out = torch.full((end + 7,), NAN)
    absent = hash_gather_joined(
        [index.buckets for index, _, _ in parts], [src for _, src, _ in parts],
        [ids for _, _, ids in parts], offsets, out,
    )  # fmt: skip
    expected = torch.full_like(out, NAN)
    for (index, src, ids), offset, positions in zip(parts, offsets, absent):
        view = expected[offset : offset + len(ids) * src.shape[1]].view(len(ids), -1)
        assert torch.equal(positions, hash_gather_rows(*index.buckets, src, ids, view))
        assert len(positions) == 30
    assert torch.equal(out.isnan(), expected.isnan())  # absent rows and gaps untouched
    assert torch.equal(out.nan_to_num(), expected.nan_to_num())


def test_a_joined_gather_of_no_maps_or_no_ids_writes_nothing():
    require_native()
    out = torch.full((4,), NAN)
    assert hash_gather_joined([], [], [], [], out) == []
    index = IdIndex(capacity=16)
    empty = torch.empty(0, dtype=torch.int64)
    [absent] = hash_gather_joined([index.buckets], [torch.randn(3, 2)], [empty], [4], out)
    assert len(absent) == 0 and bool(out.isnan().all())


def _two_maps():
    rng = np.random.default_rng(5)
    parts = _maps(rng, [4, 4])
    maps = [index.buckets for index, _, _ in parts]
    srcs = [src for _, src, _ in parts]
    ids = [ids for _, _, ids in parts]
    return maps, srcs, ids, len(ids[0]) * 4


@pytest.mark.parametrize(
    "case, match",
    [
        ("overlap", "start at element"),
        ("past-end", "do not fit in out"),
        ("offset-past-end", "start at element"),
        ("negative-offset", "start at element"),
        ("dtype", "differ in dtype"),
        ("alias", "must not share src's storage"),
        ("short-list", "one entry per table"),
        ("slot-outside-src", "outside src's"),
        ("bad-ids", "contiguous 1-D int64"),
    ],
)
def test_a_refused_joined_gather_leaves_out_untouched(case, match):
    """Each fault sits in the second map, after a first map that would have been written."""
    require_native()
    maps, srcs, ids, size = _two_maps()
    offsets = [0, size]
    out = torch.full((2 * size,), NAN)
    if case == "overlap":
        offsets[1] = size - 1
    elif case == "past-end":
        offsets[1] = size + 1
    elif case == "offset-past-end":
        offsets[1] = 2 * size + 1
    elif case == "negative-offset":
        offsets = [0, -1]
    elif case == "dtype":
        srcs[1] = srcs[1].double()
    elif case == "alias":
        srcs[1] = out[: 400 * 4].view(400, 4)
    elif case == "short-list":
        ids = ids[:1]
    elif case == "slot-outside-src":
        srcs[1] = srcs[1][:10]
    elif case == "bad-ids":
        ids[1] = ids[1].int()
    before = out.clone()
    with pytest.raises(RuntimeError, match=match):
        hash_gather_joined(maps, srcs, ids, offsets, out)
    assert torch.equal(out.isnan(), before.isnan())


SPECS = [
    TableSpec("b", dim=4, initializer=InitializerSpec(InitKind.UNIFORM, scale=0.5, seed=3)),
    TableSpec("a", dim=2),
    TableSpec("c", dim=3, initializer=InitializerSpec(InitKind.NORMAL, scale=0.1)),
]


class _SeparateStore(InMemoryStore):
    """A memory store whose reads do not join the native pass, as a Redis tier's."""

    def reads_natively(self) -> bool:
        return False


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
    """Tables b, a (in memory) and c (read alone), each holding some rows, locks recorded."""
    tables = [
        Table(SPECS[0]),
        Table(SPECS[1]),
        Table(SPECS[2], _SeparateStore(3, state_width(SPECS[2].optimizer.kind, 3))),
    ]
    for table in tables:
        ids = np.arange(0, 60, 2, dtype=np.int64)
        table.push(ids, torch.ones(len(ids), table.spec.dim), "seed")
        table._lock = _RecordingLock(table.spec.name, order)
    return tables


def test_read_tables_equals_each_tables_read_weights():
    """Native and separate tables, a table read twice, absent ids (initial rows) and an
    empty read: the same bytes, counters and lock order as reading each alone."""
    require_native()
    order: list[str] = []
    tables, twins = _tables(order), _tables([])
    rng = np.random.default_rng(2)
    picks = [0, 1, 2, 0, 1]  # b, a, c, b again, a with no ids
    reads = [(k, rng.integers(0, 90, size=0 if i == 4 else 40)) for i, k in enumerate(picks)]
    size = sum(len(ids) * tables[k].spec.dim for k, ids in reads)
    out = torch.full((size,), NAN)
    read_tables([(tables[k], ids) for k, ids in reads], out)
    expected = torch.cat([twins[k].read_weights(ids).view(-1) for k, ids in reads])
    assert torch.equal(out, expected)
    assert order == ["a", "b", "c"]  # b and a together in name order, each once; then c
    for table, twin in zip(tables, twins):
        assert table.counters == twin.counters
    assert not any(table._lock._lock.locked() for table in tables)


def test_read_tables_makes_initial_rows_for_ids_never_written():
    require_native()
    table = Table(SPECS[0])
    ids = np.array([5, 7, 5], dtype=np.int64)
    out = torch.full((12,), NAN)
    read_tables([(table, ids)], out)
    assert torch.equal(out.view(3, 4), Table(SPECS[0]).read_weights(ids))
    assert not bool(out.isnan().any()) and not torch.equal(out[:4], out[4:8])
