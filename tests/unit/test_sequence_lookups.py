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


def test_a_file_too_small_to_train_on_is_refused_before_any_table(tmp_path):
    import pytest
    from ember.trainer.config import TrainConfig
    from ember.trainer.train_sequences import _data

    path = tmp_path / "views.csv"
    path.write_text("1,5,1\n2,6,1\n3,7,1\n")  # every user has one interaction: no sample
    config = TrainConfig(endpoints=("unused:0",), model="sasrec", interactions_path=str(path))
    with pytest.raises(ValueError, match="0 training samples .* a sample per rank"):
        _data(config, world=1)
    with pytest.raises(ValueError, match="reading .*missing.csv failed: rank 0: FileNotFound"):
        _data(
            TrainConfig(**{**config.__dict__, "interactions_path": str(tmp_path / "missing.csv")}),
            1,
        )


def test_file_popularity_counts_training_histories_and_targets(tmp_path):
    from ember.trainer.data.interactions import InteractionsFile

    path = tmp_path / "views.csv"
    path.write_text("1,30,1\n1,20,2\n1,20,3\n2,30,1\n2,10,2\n")
    data = InteractionsFile.read(path, max_len=5)
    assert data.raw_items[data.popularity_ranking(3)].tolist() == [20, 30, 10]
