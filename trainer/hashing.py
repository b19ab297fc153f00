"""Stateless hash-derived values keyed on (seed, feature, id)."""

from __future__ import annotations

import operator

import numpy as np
from ember.kernels.hash_map import mix64

_FEATURE_STREAM = np.uint64(0xA24BAED4963EE407)


def one_or_column(values: float | np.ndarray, name: str) -> np.ndarray:
    """``values`` as an array: one value (0-d) or a column of shape ``(F, 1)``, which
    broadcasts against per-row arrays of shape ``(F, N)``.

    Raises:
        ValueError: an array of another shape, named ``name``.
    """
    array = np.asarray(values)
    if array.ndim and (array.ndim != 2 or array.shape[1] != 1):
        raise ValueError(f"{name} must be one value or a column (F, 1), got shape {array.shape}")
    return array


def hashed_uniform(seed: int, feature: int | np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Uniform floats in (0, 1), one per id, a pure function of (seed, feature, id).

    ``feature`` is one feature, or a column of features, shape ``(F, 1)``, for ids of shape
    ``(F, N)``: row f holds feature ``feature[f, 0]``'s ids.

    Raises:
        ValueError: ``feature`` is an array of another shape.
        TypeError: a feature is not an integer.
    """
    features = one_or_column(feature, "feature")
    streams = [seed * 1_000_003 + operator.index(f) for f in features.ravel().tolist()]
    keys = (mix64(np.array(streams, dtype=np.uint64)) ^ _FEATURE_STREAM).reshape(features.shape)
    bits = mix64(ids.astype(np.int64).view(np.uint64) ^ keys)
    return ((bits >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


def hashed_normal(seed: int, feature: int | np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Standard normal floats, one per id, a pure function of (seed, feature, id);
    ``feature`` as for :func:`hashed_uniform`."""
    u1 = hashed_uniform(seed, feature, ids)
    u2 = hashed_uniform(seed + 1, feature, ids)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
