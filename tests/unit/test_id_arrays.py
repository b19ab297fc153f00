import numpy as np
import pytest
import torch
from ember.ps_server.id_arrays import sum_duplicates
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
