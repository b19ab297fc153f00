"""Every native op against its pure-torch reference (and the reference against a plain definition)."""

import contextlib
import itertools

import pytest
import torch
from ember.kernels import loader
from ember.kernels.dedup import (
    plan_features,
    unique_inverse,
    unique_inverse_reference,
)
from ember.kernels.pack import pack_rows, unpack_rows
from ember.kernels.rows import gather_rows, scatter_add_rows, scatter_rows
from ember.kernels.split import split_tables
from hypothesis import given, settings
from hypothesis import strategies as st

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
SMALL_IDS = st.lists(st.one_of(st.integers(INT64_MIN, INT64_MAX), st.integers(-3, 3)), max_size=60)

ID_CASES = {
    "empty": torch.empty(0, dtype=torch.int64),
    "all-duplicates": torch.full((1000,), 42, dtype=torch.int64),
    "int64-extremes": torch.tensor([INT64_MAX, INT64_MIN, 0, -1, INT64_MAX, INT64_MIN, -1]),
    "zipf-1M": (torch.distributions.Pareto(1.0, 1.2).sample((1_000_000,)).clamp(max=1e12)).long(),
    "random-1M": torch.randint(INT64_MIN, INT64_MAX, (1_000_000,)),
}


def first_occurrence_definition(ids: list[int]) -> tuple[list[int], list[int], list[int]]:
    position: dict[int, int] = {}
    counts: list[int] = []
    inverse = []
    for i in ids:
        if i not in position:
            position[i] = len(position)
            counts.append(0)
        counts[position[i]] += 1
        inverse.append(position[i])
    return list(position), inverse, counts


@pytest.mark.parametrize("case", ID_CASES, ids=str)
def test_unique_inverse_matches_reference(backend, case):
    ids = ID_CASES[case]
    unique, inverse, counts = unique_inverse(ids)
    expected = unique_inverse_reference(ids)
    for got, want in zip((unique, inverse, counts), expected):
        assert got.dtype == torch.int64 and torch.equal(got, want)
    assert torch.equal(unique[inverse], ids)
    assert int(counts.sum()) == len(ids)


@pytest.mark.parametrize("case", ID_CASES, ids=str)
def test_plan_features_matches_torch_unique_per_table(backend, case):
    """Large and skewed id sets: two features of one table, a third of another."""
    ids = ID_CASES[case] & INT64_MAX  # non-negative, as features' ids are
    parts = ids.tensor_split(3)
    offsets = [torch.tensor([0, len(part)]) for part in parts]
    unique, inverse, _ = plan_features(list(parts), offsets, [0, 0, 1], 2)
    first, second = torch.cat(parts[:2]), parts[2]
    assert torch.equal(unique[0], torch.unique(first)) and torch.equal(
        unique[1], torch.unique(second)
    )
    assert torch.equal(torch.cat(unique)[inverse], ids)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(SMALL_IDS, SMALL_IDS, st.integers(0, 1000)), max_size=4))
def test_split_tables_is_each_tables_membership_numbered_across_tables(tables):
    keys = [torch.tensor(sorted(set(k)), dtype=torch.int64) for k, _, _ in tables]
    ids = [torch.tensor(i, dtype=torch.int64) for _, i, _ in tables]
    starts = [start for _, _, start in tables]
    found, missing, key_at, counts = [], [], [], []
    base = 0
    for table_keys, (_, table_ids, start) in zip(keys, tables):
        ordered = table_keys.tolist()
        hits = [i for i, v in enumerate(table_ids) if v in set(ordered)]
        found += [base + i for i in hits]
        missing += [base + i for i, v in enumerate(table_ids) if v not in set(ordered)]
        key_at += [start + ordered.index(table_ids[i]) for i in hits]
        counts.append(len(hits))
        base += len(table_ids)
    for use_native in (True, False):
        with _backend(use_native):
            got = split_tables(keys, ids, starts)
        assert [got[0].tolist(), got[1].tolist(), got[2].tolist(), got[3]] == [
            found,
            missing,
            key_at,
            counts,
        ]


FEATURE_BAGS = st.lists(  # features, each a list of bags of non-negative ids, and a table
    st.tuples(
        st.lists(
            st.lists(st.one_of(st.integers(0, INT64_MAX), st.integers(0, 5)), max_size=3),
            max_size=6,
        ),
        st.integers(0, 2),
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=80, deadline=None)
@given(FEATURE_BAGS)
def test_plan_features_deduplicates_each_table_and_numbers_rows_across_tables(features):
    values = [
        torch.tensor([i for bag in bags for i in bag], dtype=torch.int64) for bags, _ in features
    ]
    offsets = [
        torch.tensor([0, *itertools.accumulate(len(bag) for bag in bags)], dtype=torch.int64)
        for bags, _ in features
    ]
    table_of = [table for _, table in features]
    for use_native in (True, False):
        with _backend(use_native):
            unique, inverse, one_id_bags = plan_features(values, offsets, table_of, 3)
        assert [u.tolist() for u in unique] == [
            sorted({i for (bags, t) in features if t == table for bag in bags for i in bag})
            for table in range(3)
        ]
        assert torch.equal(torch.cat(unique)[inverse], torch.cat(values))
        # A feature without bags: vacuously one id per bag.
        assert one_id_bags == [all(len(bag) == 1 for bag in bags) for bags, _ in features]


@pytest.mark.parametrize(
    "values, offsets, table, message",
    [
        ([1, -5], [0, 1, 2], 0, "feature 1: ids must be >= 0, got -5"),
        ([1, 2], [1, 2], 0, "feature 1: offsets must rise from 0 to len"),
        ([1, 2], [0, 3], 0, "feature 1: offsets must rise from 0 to len"),
        ([1, 2], [0, 2, 1, 2], 0, "feature 1: offsets must rise from 0 to len"),
        (
            [1, 2],
            [0, 3 * 2**61, -(2**62), 2],
            0,
            "feature 1: offsets must rise",
        ),  # differences overflow
        ([1], [0, 1], 2, r"feature 1: table 2 is out of range \[0, 2\)"),
        ([1], [0, 1], -1, r"feature 1: table -1 is out of range \[0, 2\)"),
    ],
)
def test_plan_features_refuses_malformed_features_alike_on_both_backends(
    values, offsets, table, message
):
    good = torch.tensor([3]), torch.tensor([0, 1])
    bad = torch.tensor(values, dtype=torch.int64), torch.tensor(offsets, dtype=torch.int64)
    for use_native in (True, False):
        with _backend(use_native), pytest.raises(ValueError, match=message):
            plan_features([good[0], bad[0]], [good[1], bad[1]], [0, table], 2)


@settings(max_examples=60, deadline=None)
@given(SMALL_IDS)
def test_unique_inverse_reference_is_first_occurrence_order(values):
    got = unique_inverse_reference(torch.tensor(values, dtype=torch.int64))
    assert [t.tolist() for t in got] == list(first_occurrence_definition(values))


@contextlib.contextmanager
def _backend(native: bool):
    """The native ops where ``native`` (as built), else the reference, for a block."""
    forced = loader._reference_forced
    loader._reference_forced = forced or not native
    try:
        yield
    finally:
        loader._reference_forced = forced


def random_rows(rows: int, dim: int, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(rows, dim, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("count", [0, 1, 1_000_000])
def test_gather_and_scatter_match_indexing(backend, count):
    table = random_rows(50_000, 64)
    index = torch.randint(0, len(table), (count,))
    out = torch.empty(count, 64)
    assert torch.equal(gather_rows(table, index, out), table[index])
    distinct = torch.randperm(len(table))[: min(count, len(table))]
    updates = random_rows(len(distinct), 64)
    expected = table.clone()
    expected[distinct] = updates
    assert torch.equal(scatter_rows(table, distinct, updates), expected)


def test_gather_and_scatter_of_1d_rows(backend):
    versions = torch.arange(100, dtype=torch.int64) * 7
    index = torch.tensor([5, 0, 99, 5])
    assert gather_rows(versions, index, torch.empty(4, dtype=torch.int64)).tolist() == [
        35,
        0,
        693,
        35,
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", ["empty", "all-duplicates", "random-1M"])
def test_scatter_add_is_the_float64_segment_sum(backend, dtype, case):
    ids = ID_CASES[case]
    _, inverse, counts = unique_inverse(ids)
    grads = random_rows(len(ids), 16, dtype)
    summed = scatter_add_rows(torch.zeros(len(counts), 16, dtype=dtype), inverse, grads)
    expected = torch.zeros(len(counts), 16, dtype=torch.float64).index_add_(
        0, inverse, grads.double()
    )
    tolerance = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(summed.double(), expected, rtol=tolerance, atol=tolerance * 30)
    again = scatter_add_rows(torch.zeros(len(counts), 16, dtype=dtype), inverse, grads)
    assert torch.equal(summed, again)  # deterministic: bit-identical on a re-run


def test_native_scatter_add_equals_sequential_reference_exactly():
    from tests.support.native import require_native

    require_native()
    inverse = torch.randint(0, 1000, (200_000,))
    grads = random_rows(len(inverse), 32)
    native = scatter_add_rows(torch.zeros(1000, 32), inverse, grads)
    assert torch.equal(native, torch.zeros(1000, 32).index_add_(0, inverse, grads))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: gather_rows(torch.zeros(4, 3), torch.tensor([0, 4]), torch.empty(2, 3)), "out of range|out of bounds"),
        (lambda: gather_rows(torch.zeros(4, 3), torch.tensor([-1]), torch.empty(1, 3)), "out of range|out of bounds"),
        (lambda: gather_rows(torch.zeros(4, 3), torch.tensor([0]), torch.empty(1, 2)), "differ"),
        (lambda: gather_rows(torch.zeros(4, 3), torch.tensor([0]), torch.empty(1, 3, dtype=torch.float64)), "differ"),
        (lambda: gather_rows(torch.zeros(4, 3), torch.tensor([0.0]), torch.empty(1, 3)), "int64"),
        (lambda: gather_rows(torch.zeros(4, 3), torch.tensor([0, 1]), torch.empty(1, 3)), "entries"),
        (lambda: gather_rows(torch.zeros(3, 4).t(), torch.tensor([0]), torch.empty(1, 3)), "contiguous"),
        (lambda: scatter_rows(torch.zeros(4, 3), torch.tensor([9]), torch.ones(1, 3)), "out of range|out of bounds"),
        (lambda: scatter_add_rows(torch.zeros(4, 3), torch.tensor([4]), torch.ones(1, 3)), "out of range|out of bounds"),
        (lambda: scatter_add_rows(torch.zeros(4, 3, dtype=torch.int64), torch.tensor([0]), torch.ones(1, 3, dtype=torch.int64)), "floating"),
    ],
)  # fmt: skip
def test_bad_row_ops_raise_and_write_nothing(backend, call, match):
    with pytest.raises((ValueError, RuntimeError, IndexError), match=match):
        call()


def test_an_out_of_range_scatter_changes_nothing(backend):
    table = random_rows(8, 4)
    before = table.clone()
    with pytest.raises((RuntimeError, IndexError)):
        scatter_rows(table, torch.tensor([1, 2, 8]), torch.ones(3, 4))
    with pytest.raises((RuntimeError, IndexError)):
        scatter_add_rows(table, torch.tensor([1, 2, -1]), torch.ones(3, 4))
    assert torch.equal(table, before)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_pack_rounds_like_torch_and_unpacks_exactly(backend, dtype):
    rows = torch.cat([
        random_rows(100_000, 64) * 10.0 ** torch.randint(-8, 6, (100_000, 1)),
        torch.tensor([[0.0, -0.0, float("inf"), float("-inf"), 65520.0, 1e-8, 3.4e38, 1.0 + 2**-11] * 8]),
    ])  # fmt: skip
    packed = pack_rows(rows, dtype)
    assert packed.dtype == dtype and packed.shape == rows.shape
    assert torch.equal(packed.view(torch.int16), rows.to(dtype).view(torch.int16))
    assert torch.equal(unpack_rows(packed), packed.to(torch.float32))


def test_pack_keeps_nan(backend):
    packed = pack_rows(torch.tensor([[float("nan"), 1.0]]), torch.bfloat16)
    assert torch.isnan(unpack_rows(packed)[0, 0]) and unpack_rows(packed)[0, 1] == 1.0


def test_pack_refuses_other_dtypes(backend):
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        pack_rows(torch.zeros(2, 2), torch.int8)
    with pytest.raises(ValueError, match="float32"):
        pack_rows(torch.zeros(2, 2, dtype=torch.float64), torch.float16)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        unpack_rows(torch.zeros(2, 2))


def test_every_op_accepts_empty_input(backend):
    from ember.kernels.hash_map import EMPTY, hash_erase, hash_find, hash_insert
    from ember.kernels.optim import fused_row_update
    from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec

    none = torch.empty(0, dtype=torch.int64)
    keys, slots = torch.full((16,), EMPTY), torch.zeros(16, dtype=torch.int64)
    hash_insert(keys, slots, none, none)
    assert len(hash_find(keys, slots, none)) == 0 and len(hash_erase(keys, slots, none)) == 0
    assert (keys == EMPTY).all()
    weights, state = torch.randn(4, 3), torch.rand(4, 6)
    versions = torch.zeros(4, dtype=torch.int64)
    before = weights.clone()
    fused_row_update(
        OptimizerSpec(OptimizerKind.ADAM), weights, state, versions, none, torch.empty(0, 3)
    )
    assert torch.equal(weights, before) and not versions.any()
    for dtype in (torch.float16, torch.bfloat16):
        assert unpack_rows(pack_rows(torch.empty(0, 3), dtype)).shape == (0, 3)
    assert scatter_rows(weights, none, torch.empty(0, 3)) is weights
