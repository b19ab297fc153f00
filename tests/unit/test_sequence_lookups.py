"""The sequence model's lookups: each sample's candidates (target first) stay together."""

import torch
from ember.trainer.data.batch import JaggedIds
from ember.trainer.data.sequences import SequenceBatch
from ember.trainer.train_sequences import lookup_features


def test_candidates_are_laid_out_sample_by_sample_target_first():
    batch = SequenceBatch(
        users=torch.tensor([7, 8, 9]),
        history=JaggedIds(torch.tensor([1, 2, 3, 4, 5, 6]), torch.tensor([0, 1, 3, 6])),
        targets=torch.tensor([10, 20, 30]),
    )
    negatives = torch.tensor([[11, 12], [21, 22], [31, 32]])
    items, users = lookup_features(batch, negatives)
    history = len(batch.history.values)
    assert items.values[:history].tolist() == [1, 2, 3, 4, 5, 6]
    candidates = items.values[history:].view(3, -1)
    assert candidates.tolist() == [[10, 11, 12], [20, 21, 22], [30, 31, 32]]
    assert users.values.tolist() == [7, 8, 9]
    assert items.batch_size == len(items.values)  # one id per bag: one row per id


def test_scores_pair_each_sample_with_its_own_candidates():
    """Rows that carry their item id: the score of column c is the id of candidate c."""
    from ember.trainer.train_sequences import _scores

    batch = SequenceBatch(
        users=torch.tensor([7, 8]),
        history=JaggedIds(torch.tensor([1, 2, 3]), torch.tensor([0, 1, 3])),
        targets=torch.tensor([10, 20]),
    )
    items, _ = lookup_features(batch, torch.tensor([[11, 12], [21, 22]]))
    rows = torch.zeros(len(items.values), 4, dtype=torch.float64)
    rows[:, 0] = items.values.double()

    def representation(history_rows, offsets, user_rows):  # a stand-in model: [1, 0, 0, 0]
        return torch.tensor([[1.0, 0, 0, 0]] * len(user_rows), dtype=torch.float64)

    scores = _scores(representation, batch, rows, torch.zeros(2, 4, dtype=torch.float64))
    assert scores.tolist() == [[10, 11, 12], [20, 21, 22]]
