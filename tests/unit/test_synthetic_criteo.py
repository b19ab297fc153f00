"""The synthetic Criteo data: a pure function of its key, drawn for all features at once and
equal, bit for bit, to drawing feature by feature."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from ember.trainer.data.batch import Batch
from ember.trainer.data.synthetic import (
    NUM_DENSE,
    SyntheticCriteo,
    SyntheticCriteoConfig,
    zipf_ranks,
)
from ember.trainer.hashing import hashed_normal, hashed_uniform

CONFIGS = [
    SyntheticCriteoConfig(),
    SyntheticCriteoConfig(cardinalities=(5, 100, 7), ids_per_feature=3, signal=2.5, seed=9),
    SyntheticCriteoConfig(cardinalities=(1, 2), zipf_exponent=0.8, seed=3),
]


def _feature_by_feature(
    data: SyntheticCriteo, batch_size: int, index: int, split: str, part: int
) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """The data set's definition, one feature at a time: the reference for the joined draw."""
    config = data.config
    rng = np.random.default_rng([config.seed, {"train": 0, "test": 1}[split], part, index])
    dense = np.log1p(rng.lognormal(0.0, 1.0, (batch_size, NUM_DENSE))).astype(np.float32)
    logit = -1.0 + (dense - 0.7) @ data._dense_weights
    per_sample = config.ids_per_feature
    values = []
    for feature, cardinality in enumerate(config.cardinalities):
        ids = zipf_ranks(rng, cardinality, config.zipf_exponent, batch_size * per_sample)
        weights = hashed_normal(config.seed, feature, ids) * config.signal / np.sqrt(per_sample)
        logit = logit + weights.reshape(batch_size, per_sample).sum(axis=1) / np.sqrt(
            len(config.cardinalities)
        )
        values.append(ids)
    labels = (rng.random(batch_size) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
    return dense, values, labels


def _digest(batch: Batch) -> str:
    digest = hashlib.sha256(batch.dense.numpy().tobytes() + batch.labels.numpy().tobytes())
    for feature in batch.sparse:
        digest.update(feature.values.numpy().tobytes() + feature.offsets.numpy().tobytes())
    return digest.hexdigest()[:16]


@pytest.mark.parametrize(
    ("config", "key", "expected"),
    [(CONFIGS[0], (1024, 0, "train", 0), "d3ceb592feb16cfa"), (CONFIGS[1], (7, 5, "test", 2), "66ada7dbcb485674")],
    ids=["criteo", "multi-hot"],
)  # fmt: skip
def test_the_data_set_is_the_one_earlier_versions_drew(
    config: SyntheticCriteoConfig, key: tuple, expected: str
) -> None:
    """Pinned digests of batches drawn by the feature-by-feature generator (40d2ae1): runs,
    checkpoints and recorded figures stay comparable across versions."""
    assert _digest(SyntheticCriteo(config).batch(*key)) == expected


@pytest.mark.parametrize("config", CONFIGS, ids=["criteo", "multi-hot", "tiny"])
@pytest.mark.parametrize(("batch_size", "index", "split", "part"), [(1024, 0, "train", 0), (7, 5, "test", 2), (1, 3, "train", 1)])  # fmt: skip
def test_a_batch_equals_drawing_feature_by_feature(
    config: SyntheticCriteoConfig, batch_size: int, index: int, split: str, part: int
) -> None:
    data = SyntheticCriteo(config)
    batch = data.batch(batch_size, index, split, part)
    dense, values, labels = _feature_by_feature(data, batch_size, index, split, part)
    assert torch.equal(batch.dense, torch.from_numpy(dense))
    assert torch.equal(batch.labels, torch.from_numpy(labels))
    assert len(batch.sparse) == len(config.cardinalities)
    per_sample = config.ids_per_feature
    for jagged, ids, cardinality in zip(batch.sparse, values, config.cardinalities, strict=True):
        assert torch.equal(jagged.values, torch.from_numpy(ids))
        assert jagged.offsets.tolist() == list(range(0, batch_size * per_sample + 1, per_sample))
        assert 0 <= int(jagged.values.min()) and int(jagged.values.max()) < cardinality


def test_batches_are_a_pure_function_of_their_key() -> None:
    data = SyntheticCriteo()
    first = data.batch(64, 4, "train", 1)
    again = SyntheticCriteo().batch(64, 4, "train", 1)
    assert torch.equal(first.dense, again.dense) and torch.equal(first.labels, again.labels)
    for other in (data.batch(64, 5, "train", 1), data.batch(64, 4, "test", 1), data.batch(64, 4, "train", 2)):  # fmt: skip
        assert not torch.equal(first.sparse[0].values, other.sparse[0].values)
    # The tensors of one feature are its own: writing one leaves the others alone.
    first.sparse[0].offsets.zero_()
    assert first.sparse[1].offsets[-1] == 64


def test_zipf_ranks_with_a_column_of_bounds_equal_one_call_per_bound() -> None:
    bounds = np.array([[1], [10], [1000]])
    joined = zipf_ranks(np.random.default_rng(11), bounds, 1.2, 500)
    rng = np.random.default_rng(11)
    one_by_one = [zipf_ranks(rng, int(n), 1.2, 500) for n in bounds[:, 0]]
    assert joined.shape == (3, 500)
    assert np.array_equal(joined, np.stack(one_by_one))
    assert (joined >= 0).all() and (joined < bounds).all()


def test_hashed_values_with_a_column_of_features_equal_one_call_per_feature() -> None:
    ids = np.random.default_rng(2).integers(-(2**62), 2**62, (4, 300))
    features = np.array([[0], [3], [25], [7]])
    uniform = hashed_uniform(4, features, ids)
    normal = hashed_normal(4, features, ids)
    for row, feature in enumerate(features[:, 0]):
        assert np.array_equal(uniform[row], hashed_uniform(4, int(feature), ids[row]))
        assert np.array_equal(normal[row], hashed_normal(4, int(feature), ids[row]))
    assert ((uniform > 0.0) & (uniform < 1.0)).all()
    # A different feature or seed gives different values for the same ids.
    assert not np.array_equal(uniform[0], hashed_uniform(4, 1, ids[0]))
    assert not np.array_equal(uniform[0], hashed_uniform(5, 0, ids[0]))


def test_bounds_or_features_of_another_shape_are_refused() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=r"column \(F, 1\)"):
        zipf_ranks(rng, np.array([1, 10, 1000]), 1.2, 3)  # a row: it would bound columns
    with pytest.raises(ValueError, match=r"column \(F, 1\)"):
        hashed_uniform(0, np.array([0, 1]), np.zeros((2, 3), dtype=np.int64))
    with pytest.raises(TypeError):
        hashed_uniform(0, 1.0, np.zeros(3, dtype=np.int64))
