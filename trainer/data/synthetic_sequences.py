"""Deterministic synthetic interaction sequences with a planted next-item law.

Item popularity is a bounded Zipf law (item 0 the most popular). Every item has
``successors`` fixed successor items, a hash of (seed, item, slot). A user's
sequence is a walk: the next item is one of the current item's successors
(uniformly) with probability ``follow_prob``, otherwise a fresh Zipf draw. So
the last history item predicts the target far better than popularity does.

History lengths are heavy-tailed: a discretised lognormal with median
``median_length``, capped at ``length_cap``; histories longer than ``max_len``
are cut by :func:`ember.trainer.data.sequences.recent_history`'s rule and
counted. Every user has >= 2 interactions by construction, so none is dropped.

Every batch is a pure function of (seed, split, index). Train users are ids in
``[0, num_users)``; test users are held-out ids in
``[num_users, num_users + num_test_users)``. User ids carry no signal.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from ember.trainer.data.sequences import SequenceBatch, SequenceStats, recent_history
from ember.trainer.data.synthetic import zipf_ranks
from ember.trainer.hashing import hashed_uniform

SPLITS = {"train": 0, "test": 1}
_SUCCESSOR_FEATURE = 0x53554343


@dataclasses.dataclass(frozen=True)
class SyntheticSequencesConfig:
    """Shape of the synthetic sequences.

    Attributes:
        num_items: item ids are ``[0, num_items)``.
        num_users: train user ids are ``[0, num_users)``.
        num_test_users: held-out user ids follow the train ones.
        max_len: the longest history kept; longer ones lose their oldest items.
        median_length: median history length before truncation.
        length_sigma: log-space spread of history lengths (the tail's weight).
        length_cap: the longest history generated (before truncation).
        zipf_exponent: skew of item popularity (> 0, != 1).
        successors: fixed successors per item.
        follow_prob: probability that the next item is a successor of the current one.
        seed: seed of the data and of the successor law.
    """

    num_items: int = 20_000
    num_users: int = 50_000
    num_test_users: int = 5_000
    max_len: int = 50
    median_length: float = 8.0
    length_sigma: float = 1.0
    length_cap: int = 200
    zipf_exponent: float = 1.1
    successors: int = 4
    follow_prob: float = 0.6
    seed: int = 0

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        for name, least in (
            ("num_items", 2),
            ("num_users", 1),
            ("num_test_users", 1),
            ("max_len", 1),
            ("length_cap", 1),
            ("successors", 1),
        ):
            if getattr(self, name) < least:
                raise ValueError(f"{name} must be >= {least}, got {getattr(self, name)}")
        if not 1.0 <= self.median_length <= self.length_cap:
            raise ValueError(
                f"median_length must be in [1, length_cap={self.length_cap}], "
                f"got {self.median_length}"
            )
        if not 0.0 <= self.length_sigma < math.inf:
            raise ValueError(f"length_sigma must be finite and >= 0, got {self.length_sigma}")
        if self.zipf_exponent <= 0 or self.zipf_exponent == 1.0:
            raise ValueError(f"zipf_exponent must be > 0 and != 1, got {self.zipf_exponent}")
        if not 0.0 <= self.follow_prob <= 1.0:
            raise ValueError(f"follow_prob must be in [0, 1], got {self.follow_prob}")


class SyntheticSequences:
    """Batches of synthetic next-item samples.

    Attributes:
        stats: histories truncated over every :meth:`batch` call so far.

    Example:
        >>> data = SyntheticSequences(SyntheticSequencesConfig(num_items=100, max_len=5))
        >>> batch = data.batch(batch_size=4, index=0)
        >>> batch.batch_size, int(batch.lengths.max()) <= 5
        (4, True)
    """

    def __init__(self, config: SyntheticSequencesConfig = SyntheticSequencesConfig()) -> None:
        config.validate()
        self.config = config
        self.stats = SequenceStats()
        items = np.arange(config.num_items, dtype=np.int64)
        keys = items[:, None] * config.successors + np.arange(config.successors)[None, :]
        uniform = hashed_uniform(config.seed, _SUCCESSOR_FEATURE, keys.ravel())
        self._successors = (uniform * config.num_items).astype(np.int64).reshape(keys.shape)

    def batch(self, batch_size: int, index: int, split: str = "train") -> SequenceBatch:
        """Batch ``index`` of ``split`` ("train" or "test"), a pure function of its arguments.

        Raises:
            ValueError: ``batch_size`` < 1 or an unknown split.
        """
        return self._batch(batch_size, index, split, self.stats)

    def successors(self, items: np.ndarray) -> np.ndarray:
        """int64 [n, successors]: the fixed successors of each of the int64 [n] ``items``."""
        return self._successors[np.asarray(items, dtype=np.int64)]

    def popularity_ranking(self, k: int, batches: int = 8, batch_size: int = 1024) -> torch.Tensor:
        """The ``k`` items seen most often in train batches ``0 .. batches - 1``.

        Every history item and every target counts once, as a most-popular baseline
        fitted on training data would; ties go to the lower id. The generator's
        ``stats`` are left alone.

        Raises:
            ValueError: ``k`` not in ``[1, num_items]`` or ``batches`` < 1.
        """
        if not 1 <= k <= self.config.num_items:
            raise ValueError(f"k must be in [1, {self.config.num_items}], got {k}")
        if batches < 1:
            raise ValueError(f"batches must be >= 1, got {batches}")
        counts = torch.zeros(self.config.num_items, dtype=torch.int64)
        for index in range(batches):
            batch = self._batch(batch_size, index, "train", SequenceStats())
            items = torch.cat([batch.history.values, batch.targets])
            counts += torch.bincount(items, minlength=self.config.num_items)
        return torch.argsort(-counts, stable=True)[:k]

    def _batch(
        self, batch_size: int, index: int, split: str, stats: SequenceStats
    ) -> SequenceBatch:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if split not in SPLITS:
            raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
        config = self.config
        rng = np.random.default_rng([config.seed, SPLITS[split], index])
        first_user, user_count = (
            (0, config.num_users) if split == "train" else (config.num_users, config.num_test_users)
        )
        users = first_user + rng.integers(0, user_count, batch_size)
        raw = rng.lognormal(math.log(config.median_length), config.length_sigma, batch_size)
        lengths = np.clip(np.rint(raw), 1, config.length_cap).astype(np.int64)
        walks = self._walks(rng, batch_size, int(lengths.max()) + 1)
        # Sample b is the last lengths[b] + 1 steps of walk b: its history, then its target.
        steps = walks.shape[1]
        ends = np.arange(batch_size, dtype=np.int64) * steps + steps - 1
        history = recent_history(walks.ravel(), ends - lengths, ends, config.max_len, stats)
        return SequenceBatch(
            torch.from_numpy(users.astype(np.int64)),
            history,
            torch.from_numpy(np.ascontiguousarray(walks[:, -1])),
        )

    def _walks(self, rng: np.random.Generator, count: int, steps: int) -> np.ndarray:
        config = self.config
        follow = rng.random((steps - 1, count)) < config.follow_prob
        slots = rng.integers(0, config.successors, (steps - 1, count))
        fresh = zipf_ranks(rng, config.num_items, config.zipf_exponent, steps * count)
        walks = fresh.reshape(steps, count)
        for step in range(1, steps):
            successor = self._successors[walks[step - 1], slots[step - 1]]
            walks[step] = np.where(follow[step - 1], successor, walks[step])
        return walks.T
