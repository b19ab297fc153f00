"""A deterministic synthetic Criteo-style data set with a planted model.

13 dense and 26 categorical features; categorical ids follow a bounded Zipf law
per feature (id 0 the most popular); labels are drawn from a planted logistic
model over hashed per-id weights and the dense features, so a model can really
learn (held-out AUC well above 0.5). Every batch is a pure function of
(seed, split, part, index), so ranks read disjoint, reproducible parts.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from ember.trainer.data.batch import Batch, JaggedIds
from ember.trainer.hashing import hashed_normal, one_or_column

# Cardinalities of the 26 categorical features of the Criteo Kaggle data set.
CRITEO_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
NUM_DENSE = 13
_SPLITS = {"train": 0, "test": 1}


@dataclasses.dataclass(frozen=True)
class SyntheticCriteoConfig:
    """Shape and skew of the synthetic data.

    Attributes:
        cardinalities: ids per categorical feature.
        zipf_exponent: skew of id popularity (> 1 is heavier-headed).
        ids_per_feature: ids per sample and feature (1 = one-hot, as in Criteo).
        signal: standard deviation of the planted per-id logit weights.
        seed: seed of the data and of the planted model.
    """

    cardinalities: tuple[int, ...] = CRITEO_CARDINALITIES
    zipf_exponent: float = 1.2
    ids_per_feature: int = 1
    signal: float = 1.0
    seed: int = 0

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        if not self.cardinalities or min(self.cardinalities) < 1:
            raise ValueError("cardinalities must be a non-empty list of positive ids counts")
        if self.zipf_exponent <= 0 or self.zipf_exponent == 1.0:
            raise ValueError(f"zipf_exponent must be > 0 and != 1, got {self.zipf_exponent}")
        if self.ids_per_feature < 1:
            raise ValueError(f"ids_per_feature must be >= 1, got {self.ids_per_feature}")


class SyntheticCriteo:
    """Batches of the synthetic data set.

    Example:
        >>> data = SyntheticCriteo(SyntheticCriteoConfig(cardinalities=(100, 50)))
        >>> batch = data.batch(batch_size=8, index=0)
        >>> batch.dense.shape, len(batch.sparse), batch.labels.shape
        (torch.Size([8, 13]), 2, torch.Size([8]))
    """

    def __init__(self, config: SyntheticCriteoConfig = SyntheticCriteoConfig()) -> None:
        config.validate()
        self.config = config
        model_rng = np.random.default_rng([config.seed, 7])
        self._dense_weights = model_rng.normal(0.0, 0.5, NUM_DENSE)
        self._bias = -1.0  # about 25% positives, as in Criteo
        self._cardinalities = np.array(config.cardinalities, dtype=np.int64)[:, None]
        self._features = np.arange(len(config.cardinalities))[:, None]

    @property
    def num_features(self) -> int:
        """Number of categorical features."""
        return len(self.config.cardinalities)

    def batch(self, batch_size: int, index: int, split: str = "train", part: int = 0) -> Batch:
        """Batch ``index`` of part ``part`` (a rank's share) of ``split`` ("train" or "test")."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if split not in _SPLITS:
            raise ValueError(f"split must be one of {sorted(_SPLITS)}, got {split!r}")
        config = self.config
        rng = np.random.default_rng([config.seed, _SPLITS[split], part, index])
        dense = rng.lognormal(0.0, 1.0, (batch_size, NUM_DENSE))
        dense_features = np.log1p(dense).astype(np.float32)
        logit = self._bias + (dense_features - 0.7) @ self._dense_weights
        features = self.num_features
        per_sample = config.ids_per_feature
        # One draw for every feature at once: the same numbers, in the same order, as one
        # draw per feature, for a fraction of the calls.
        ids = zipf_ranks(rng, self._cardinalities, config.zipf_exponent, batch_size * per_sample)
        weights = (
            hashed_normal(config.seed, self._features, ids) * config.signal / np.sqrt(per_sample)
        )
        logit_parts = weights.reshape(features, batch_size, per_sample).sum(axis=2) / np.sqrt(
            features
        )
        for part_of_logit in logit_parts:
            logit = logit + part_of_logit
        offsets = np.arange(0, batch_size * per_sample + 1, per_sample, dtype=np.int64)
        sparse = [
            JaggedIds(torch.from_numpy(feature_ids), torch.from_numpy(offsets.copy()))
            for feature_ids in ids
        ]
        labels = (rng.random(batch_size) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        return Batch(torch.from_numpy(dense_features), sparse, torch.from_numpy(labels))


def zipf_ranks(
    rng: np.random.Generator, n: int | np.ndarray, exponent: float, size: int
) -> np.ndarray:
    """Bounded Zipf ranks in [0, n) by inverting the continuous power-law CDF (O(1) memory).

    ``n`` is one bound (``size`` ranks), or a column of bounds of shape ``(F, 1)``: then row f
    holds ``size`` ranks below ``n[f, 0]``, the same ranks as F calls with one bound each.

    Raises:
        ValueError: ``n`` is an array of another shape.
    """
    bounds = one_or_column(n, "n")
    u = rng.random(size if bounds.ndim == 0 else (bounds.shape[0], size))
    one_minus_s = 1.0 - exponent
    scale = np.power(bounds + 1.0, one_minus_s) - 1.0
    ranks = (scale * u + 1.0) ** (1.0 / one_minus_s) - 1.0
    return np.minimum(ranks.astype(np.int64), bounds - 1)
