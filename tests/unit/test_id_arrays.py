import numpy as np
import pytest
import torch
from ember.ps_server.id_arrays import as_grad_rows, as_id_array, sum_duplicates
from hypothesis import given, settings
from hypothesis import strategies as st


def _reference(ids, grads):
    """Ascending distinct ids and their float64 sums."""
    sums = {}
    for i, row in zip(ids.tolist(), grads.double()):
        sums[i] = sums.get(i, 0) + row
    keys = sorted(sums)
    return np.array(keys, dtype=np.int64), torch.stack([sums[k] for k in keys]) if keys else None


@settings(max_examples=100, deadline=None)
@given(ids=st.lists(st.integers(0, 40), max_size=60))
def test_sums_every_id_once_in_ascending_order(ids):
    array = np.array(ids, dtype=np.int64)
    grads = torch.randn(len(ids), 3, generator=torch.Generator().manual_seed(len(ids)))
    unique, summed = sum_duplicates(array, grads)
    expected_ids, expected = _reference(array, grads)
    assert unique.tolist() == expected_ids.tolist()
    if len(ids):
        torch.testing.assert_close(summed.double(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "ids", [[1, 5, 9], [9, 1, 5], [5, 1, 5, 9]], ids=["ascending", "distinct", "duplicates"]
)
def test_rows_follow_their_ids(ids):
    array = np.array(ids, dtype=np.int64)
    grads = torch.tensor(ids, dtype=torch.float32)[:, None] * torch.tensor([[1.0, 10.0]])
    unique, summed = sum_duplicates(array, grads)
    counts = {i: ids.count(i) for i in ids}
    assert unique.tolist() == [1, 5, 9]
    assert summed.tolist() == [[i * counts[i], 10.0 * i * counts[i]] for i in (1, 5, 9)]


@pytest.mark.parametrize(
    "bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"]
)
@pytest.mark.parametrize("where", [0, 37, 63])
def test_a_gradient_that_is_not_finite_is_refused_wherever_it_is(bad, where):
    grads = torch.randn(16, 4)
    grads.view(-1)[where] = bad
    with pytest.raises(ValueError, match="NaN or Inf"):
        as_grad_rows(grads, 16, 4)


def test_finite_gradients_whose_sum_overflows_are_accepted():
    """The fast check sums the values; a sum beyond float32 alone must not refuse them, nor
    trip numpy's floating-point error handling where a user made it raise."""
    grads = torch.full((4, 2), 3e38)
    with np.errstate(all="raise"):
        assert torch.equal(as_grad_rows(grads, 4, 2), grads)
        with pytest.raises(ValueError, match="NaN or Inf"):  # +Inf and -Inf: a NaN sum
            as_grad_rows(torch.tensor([[float("inf"), -float("inf")]]), 1, 2)


@pytest.mark.parametrize(
    "ids, message",
    [
        (torch.tensor([1.0, 2.0]), "integer tensor"),
        (torch.tensor([True]), "integer tensor"),
        (torch.tensor([[1, 2]]), "1-D"),
        (torch.tensor([3, -1]), "must be >= 0, got -1"),
        (torch.tensor([3, 1], dtype=torch.int32), None),
        (torch.arange(10)[::2], None),  # int64, not contiguous
    ],
)
def test_id_tensors_are_checked_and_come_back_as_int64(ids, message):
    if message is None:
        assert as_id_array(ids).tolist() == ids.tolist() and as_id_array(ids).dtype == np.int64
        return
    with pytest.raises(ValueError, match=message):
        as_id_array(ids)


def test_duplicates_are_summed_in_order_of_occurrence_bit_for_bit():
    """float32 addition is not associative: the sums must be those of adding each id's rows
    in the order they came, whatever order a sort visits them in."""
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 50, 4000)
    grads = torch.from_numpy(
        (rng.standard_normal((4000, 2)) * 10.0 ** rng.integers(-4, 9, (4000, 1))).astype("f4")
    )
    expected: dict[int, np.ndarray] = {}
    for i, row in zip(ids.tolist(), grads.numpy()):
        expected[i] = expected.get(i, np.zeros(2, np.float32)) + row  # float32, in order
    unique, summed = sum_duplicates(ids, grads)
    assert unique.tolist() == sorted(expected)
    assert np.array_equal(summed.numpy(), np.stack([expected[i] for i in sorted(expected)]))


def test_distinct_ids_out_of_order_are_sorted_with_their_rows():
    ids = np.random.default_rng(5).permutation(5000)[:3000] * 7 - 9000
    grads = torch.from_numpy(ids.astype(np.float32))[:, None].repeat(1, 3)
    unique, summed = sum_duplicates(ids, grads)
    assert unique.tolist() == sorted(ids.tolist())
    assert torch.equal(summed[:, 0], torch.from_numpy(unique.astype(np.float32)))
