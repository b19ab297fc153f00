"""Stateless hash-derived values keyed on (seed, feature, id)."""

from __future__ import annotations

import numpy as np
from ember.kernels.hash_map import mix64

_FEATURE_STREAM = np.uint64(0xA24BAED4963EE407)


def hashed_uniform(seed: int, feature: int, ids: np.ndarray) -> np.ndarray:
    """Uniform floats in (0, 1), one per id, a pure function of (seed, feature, id)."""
    key = mix64(np.array([seed * 1_000_003 + feature], dtype=np.uint64))[0] ^ _FEATURE_STREAM
    bits = mix64(ids.astype(np.int64).view(np.uint64) ^ key)
    return ((bits >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


def hashed_normal(seed: int, feature: int, ids: np.ndarray) -> np.ndarray:
    """Standard normal floats, one per id, a pure function of (seed, feature, id)."""
    u1 = hashed_uniform(seed, feature, ids)
    u2 = hashed_uniform(seed + 1, feature, ids)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
