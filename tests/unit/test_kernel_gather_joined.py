"""The native joined ops of a shard's step reads: ``hash_gather_joined`` gathers the rows
of several id maps into one flat buffer at any alignment, and ``initial_rows_at`` writes
the initial rows of the ids it found absent. Each must equal the per-map gather and the
native initial rows bit for bit, and a refused call must leave the buffer as it was.
"""

import numpy as np
import pytest
import torch
from ember.kernels.hash_map import hash_gather_joined, hash_gather_rows
from ember.kernels.hashed_init import ZEROS, HashedInit, initial_rows_at
from ember.kernels.id_index import IdIndex

from tests.support.native import require_native

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
