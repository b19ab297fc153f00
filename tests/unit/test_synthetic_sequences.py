"""Synthetic sequences: pure batches, held-out users, heavy-tailed lengths, a learnable law."""

import dataclasses
import time

import numpy as np
import pytest
import torch
from ember.trainer.data.synthetic_sequences import SyntheticSequences, SyntheticSequencesConfig

SMALL = SyntheticSequencesConfig(num_items=2_000, num_users=1_000, num_test_users=100)


def _same(a, b) -> bool:
    return all(
        torch.equal(x, y)
        for x, y in [
            (a.users, b.users),
            (a.targets, b.targets),
            (a.history.values, b.history.values),
            (a.history.offsets, b.history.offsets),
        ]
    )


def test_a_batch_is_a_pure_function_of_seed_split_and_index():
    data, other = SyntheticSequences(SMALL), SyntheticSequences(SMALL)
    other.batch(64, 5)
    assert _same(data.batch(64, 3), other.batch(64, 3))
    assert not _same(data.batch(64, 3), data.batch(64, 4))
    assert not _same(data.batch(64, 3), data.batch(64, 3, "test"))
    reseeded = SyntheticSequences(dataclasses.replace(SMALL, seed=1))
    assert not _same(data.batch(64, 3), reseeded.batch(64, 3))


def test_test_users_are_held_out_ids():
    data = SyntheticSequences(SMALL)
    train = torch.cat([data.batch(256, i).users for i in range(4)])
    test = torch.cat([data.batch(256, i, "test").users for i in range(4)])
    assert int(train.min()) >= 0 and int(train.max()) < 1_000
    assert int(test.min()) >= 1_000 and int(test.max()) < 1_100


def test_lengths_are_heavy_tailed_and_cut_to_max_len_by_the_rule():
    data = SyntheticSequences(SMALL)
    batches = [data.batch(1024, i) for i in range(4)]
    lengths = torch.cat([b.lengths for b in batches])
    assert int(lengths.min()) >= 1 and int(lengths.max()) == SMALL.max_len
    assert 7 <= float(lengths.double().median()) <= 9
    at_cap = int((lengths == SMALL.max_len).sum())
    # About 3.4% of lognormal lengths exceed 50; each one is cut to exactly max_len.
    assert 60 <= data.stats.truncated <= at_cap <= data.stats.truncated + 10
    assert data.stats.dropped_empty == 0


def test_items_follow_the_planted_successors_so_the_last_item_beats_popularity():
    data = SyntheticSequences(SMALL)
    batch = data.batch(2048, 0, "test")
    last = batch.history.values[batch.history.offsets[1:] - 1].numpy()
    successors = data.successors(last)
    followed = (successors == batch.targets.numpy()[:, None]).any(axis=1)
    assert 0.55 <= followed.mean() <= 0.7
    popular = data.popularity_ranking(10).numpy()
    popularity_hits = np.isin(batch.targets.numpy(), popular).mean()
    oracle = np.concatenate([successors, np.broadcast_to(popular[:6], (len(last), 6))], axis=1)
    oracle_hits = (oracle == batch.targets.numpy()[:, None]).any(axis=1).mean()
    assert oracle_hits > 0.6 and oracle_hits > 2.5 * popularity_hits


def test_item_zero_is_the_most_popular():
    ranking = SyntheticSequences(SMALL).popularity_ranking(5, batches=2)
    assert ranking.shape == (5,) and int(ranking[0]) == 0 and len(set(ranking.tolist())) == 5


def test_a_batch_of_256_takes_well_under_20_ms():
    data = SyntheticSequences()
    data.batch(256, 0)
    best = min(_timed(lambda i=i: data.batch(256, i)) for i in range(1, 8))
    assert best < 0.02


def _timed(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_items", 1, "num_items must be >= 2, got 1"),
        ("max_len", 0, "max_len must be >= 1, got 0"),
        ("median_length", 500.0, r"median_length must be in \[1, length_cap=200\], got 500.0"),
        ("zipf_exponent", 1.0, "zipf_exponent must be > 0 and != 1, got 1.0"),
        ("follow_prob", 1.5, r"follow_prob must be in \[0, 1\], got 1.5"),
        ("length_sigma", -1.0, "length_sigma must be finite and >= 0, got -1.0"),
    ],
)
def test_bad_configs_are_refused(field, value, message):
    with pytest.raises(ValueError, match=message):
        SyntheticSequences(dataclasses.replace(SMALL, **{field: value}))


def test_bad_batch_arguments_are_refused():
    data = SyntheticSequences(SMALL)
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        data.batch(0, 0)
    with pytest.raises(ValueError, match=r"split must be one of \['test', 'train'\], got 'dev'"):
        data.batch(4, 0, "dev")
    with pytest.raises(ValueError, match=r"k must be in \[1, 2000\], got 0"):
        data.popularity_ranking(0)
