"""Bounded Zipf id sampling: the access skew of recommendation features."""

from __future__ import annotations

import numpy as np


class ZipfSampler:
    """Draw ids in ``[0, num_ids)`` with P(rank k) proportional to 1 / (k + 1)^exponent.

    Rank k maps to id k, so id 0 is the most popular.

    Example:
        >>> sampler = ZipfSampler(1000, exponent=1.1, seed=0)
        >>> sampler.sample(4).shape
        (4,)
    """

    def __init__(self, num_ids: int, exponent: float = 1.05, seed: int = 0) -> None:
        if num_ids < 1:
            raise ValueError(f"num_ids must be >= 1, got {num_ids}")
        if exponent < 0:
            raise ValueError(f"exponent must be >= 0, got {exponent}")
        weights = np.arange(1, num_ids + 1, dtype=np.float64) ** -exponent
        self._cdf = np.cumsum(weights)
        self._cdf /= self._cdf[-1]
        self._rng = np.random.default_rng(seed)

    def sample(self, size: int) -> np.ndarray:
        """``size`` int64 ids."""
        draws = self._rng.random(size)
        return np.minimum(
            np.searchsorted(self._cdf, draws, side="right"), len(self._cdf) - 1
        ).astype(np.int64)
