"""Sequence batches: the truncation rule, validation, and the jagged gather of select."""

import numpy as np
import pytest
import torch
from ember.trainer.data.batch import JaggedIds
from ember.trainer.data.sequences import (
    SequenceBatch,
    SequenceStats,
    recent_history,
)
from hypothesis import given, settings
from hypothesis import strategies as st


def _batch(histories: list[list[int]]) -> SequenceBatch:
    lengths = torch.tensor([len(h) for h in histories], dtype=torch.int64)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    values = torch.tensor([i for h in histories for i in h], dtype=torch.int64)
    count = len(histories)
    return SequenceBatch(
        torch.arange(100, 100 + count), JaggedIds(values, offsets), torch.arange(500, 500 + count)
    )


def _histories(batch: SequenceBatch) -> list[list[int]]:
    values, offsets = batch.history.values.tolist(), batch.history.offsets.tolist()
    return [values[offsets[b] : offsets[b + 1]] for b in range(batch.batch_size)]


def test_recent_history_refuses_a_max_len_below_one():
    with pytest.raises(ValueError, match="max_len must be >= 1, got 0"):
        recent_history(np.arange(5), np.array([0]), np.array([2]), 0, SequenceStats())


def test_recent_history_keeps_each_segments_most_recent_items():
    flat = np.arange(100, 130, dtype=np.int64)
    starts, ends = np.array([0, 10, 12, 20]), np.array([7, 12, 13, 30])
    stats = SequenceStats()
    history = recent_history(flat, starts, ends, 4, stats)
    expected = [flat[s:e].tolist()[-4:] for s, e in zip(starts, ends, strict=True)]
    assert _histories(SequenceBatch(torch.arange(4), history, torch.arange(4))) == expected
    assert stats.truncated == 2 and stats.dropped_empty == 0


def test_recent_history_refuses_an_empty_segment():
    with pytest.raises(ValueError, match="sample 1 has none"):
        recent_history(np.arange(5), np.array([0, 3]), np.array([2, 3]), 4, SequenceStats())


def test_a_batch_reports_its_size_and_lengths():
    batch = _batch([[4, 5, 6], [7], [8, 9]])
    assert batch.batch_size == 3 and batch.lengths.tolist() == [3, 1, 2]


def test_select_gathers_samples_in_the_given_order_with_repeats():
    batch = _batch([[4, 5, 6], [7], [8, 9], [1, 2, 3, 4]])
    picked = batch.select(torch.tensor([3, 0, 3, 1]))
    assert _histories(picked) == [[1, 2, 3, 4], [4, 5, 6], [1, 2, 3, 4], [7]]
    assert picked.users.tolist() == [103, 100, 103, 101]
    assert picked.targets.tolist() == [503, 500, 503, 501]
    assert picked.select(torch.tensor([], dtype=torch.int64)).batch_size == 0


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 1000), min_size=1, max_size=6), min_size=1, max_size=12),
    st.data(),
)
def test_select_matches_a_per_sample_reference(histories, data):
    batch = _batch(histories)
    indices = data.draw(st.lists(st.integers(0, len(histories) - 1), max_size=20))
    picked = batch.select(torch.tensor(indices, dtype=torch.int64))
    assert _histories(picked) == [histories[i] for i in indices]
    assert picked.targets.tolist() == [500 + i for i in indices]


def test_select_refuses_indices_outside_the_batch_or_not_integers():
    batch = _batch([[1], [2, 3]])
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 2\), got 0 to 2"):
        batch.select(torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="indices must be a 1-D integer tensor"):
        batch.select(torch.tensor([0.0]))


def test_a_batch_refuses_empty_histories_and_disagreeing_shapes():
    offsets = torch.tensor([0, 2, 2])
    with pytest.raises(ValueError, match="sample 1 has none"):
        SequenceBatch(torch.arange(2), JaggedIds(torch.arange(2), offsets), torch.arange(2))
    with pytest.raises(ValueError, match="users and targets must be 1-D of one length"):
        SequenceBatch(torch.arange(3), JaggedIds(torch.arange(2), offsets), torch.arange(2))
    with pytest.raises(ValueError, match="history offsets must have 3 entries, got 2"):
        SequenceBatch(torch.arange(2), JaggedIds(torch.arange(2), offsets[:2]), torch.arange(2))
    with pytest.raises(ValueError, match="history offsets must run from 0 to 3, got 0 to 2"):
        SequenceBatch(torch.arange(2), JaggedIds(torch.arange(3), offsets), torch.arange(2))
