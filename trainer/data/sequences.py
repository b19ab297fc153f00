"""Sequence samples for next-item prediction: the batch layout and the history rules.

A sample is a user, the items the user interacted with (oldest first) and the
next item, the target. Two rules are shared by every source of sequences:

* Truncation: a history longer than ``max_len`` keeps its ``max_len`` most
  recent items; the oldest are dropped (:func:`recent_history`).
* Empty histories: a user with fewer than 2 interactions has no history to
  predict from; the user is dropped and counted, never an error.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from ember.trainer.data.batch import JaggedIds


@dataclasses.dataclass
class SequenceStats:
    """What a source of sequences did to its users.

    Attributes:
        truncated: histories longer than ``max_len``, cut to their most recent items.
        dropped_empty: users with fewer than 2 interactions, dropped.
    """

    truncated: int = 0
    dropped_empty: int = 0


@dataclasses.dataclass
class SequenceBatch:
    """A batch of next-item samples.

    Attributes:
        users: int64 [batch] user ids.
        history: the item ids of every sample, oldest first; every sample has >= 1.
        targets: int64 [batch], the item that followed each history.

    Raises:
        ValueError: shapes that disagree, or a sample with an empty history.

    Example:
        >>> history = JaggedIds(torch.tensor([5, 6, 7]), torch.tensor([0, 2, 3]))
        >>> batch = SequenceBatch(torch.tensor([10, 11]), history, torch.tensor([8, 9]))
        >>> batch.lengths.tolist(), batch.select(torch.tensor([1])).history.values.tolist()
        ([2, 1], [7])
    """

    users: torch.Tensor
    history: JaggedIds
    targets: torch.Tensor

    def __post_init__(self) -> None:
        batch = self.targets.shape[0] if self.targets.dim() == 1 else -1
        if batch < 0 or self.users.shape != (batch,):
            raise ValueError(
                f"users and targets must be 1-D of one length, got {tuple(self.users.shape)} "
                f"and {tuple(self.targets.shape)}"
            )
        offsets = self.history.offsets
        if offsets.shape != (batch + 1,):
            raise ValueError(f"history offsets must have {batch + 1} entries, got {len(offsets)}")
        if int(offsets[0]) != 0 or int(offsets[-1]) != self.history.values.numel():
            raise ValueError(
                f"history offsets must run from 0 to {self.history.values.numel()}, "
                f"got {int(offsets[0])} to {int(offsets[-1])}"
            )
        if batch and int(self.lengths.min()) < 1:
            empty = int(torch.nonzero(self.lengths < 1)[0])
            raise ValueError(f"every history needs >= 1 item; sample {empty} has none")

    @property
    def batch_size(self) -> int:
        """Number of samples."""
        return len(self.targets)

    @property
    def lengths(self) -> torch.Tensor:
        """int64 [batch] history length of each sample."""
        return self.history.offsets.diff()

    def select(self, indices: torch.Tensor) -> SequenceBatch:
        """The samples at ``indices`` (int64 [n], repeats allowed), in that order.

        Raises:
            ValueError: ``indices`` not 1-D integers within the batch.
        """
        if indices.dim() != 1 or indices.is_floating_point() or indices.dtype == torch.bool:
            raise ValueError(
                f"indices must be a 1-D integer tensor, got {indices.dtype} "
                f"of shape {tuple(indices.shape)}"
            )
        indices = indices.to(torch.int64)
        if len(indices) and (int(indices.min()) < 0 or int(indices.max()) >= self.batch_size):
            raise ValueError(
                f"indices must lie in [0, {self.batch_size}), got {int(indices.min())} "
                f"to {int(indices.max())}"
            )
        starts = self.history.offsets[:-1][indices]
        history = _gather_segments(self.history.values, starts, self.lengths[indices])
        return SequenceBatch(self.users[indices], history, self.targets[indices])


def recent_history(
    flat: np.ndarray, starts: np.ndarray, ends: np.ndarray, max_len: int, stats: SequenceStats
) -> JaggedIds:
    """Histories ``flat[starts[b]:ends[b]]``, each cut to its ``max_len`` most recent items
    (oldest first; truncated ones counted in ``stats``), all at once.

    Args:
        flat: int64 item ids holding every history as one contiguous run, oldest first.
        starts: int64 [batch] first index of each history in ``flat``.
        ends: int64 [batch] one past the last index of each history.
        max_len: the longest history kept.
        stats: its ``truncated`` count grows by the histories cut.

    Returns:
        The kept items of every history, in sample order.

    Raises:
        ValueError: ``max_len`` < 1, or an empty history (drop those users first).
    """
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    full = ends - starts
    if len(full) and int(full.min()) < 1:
        raise ValueError(f"every history needs >= 1 item; sample {int(np.argmin(full))} has none")
    stats.truncated += int((full > max_len).sum())
    kept_starts = np.maximum(starts, ends - max_len)
    return _gather_segments(
        torch.from_numpy(np.ascontiguousarray(flat, dtype=np.int64)),
        torch.from_numpy(kept_starts.astype(np.int64)),
        torch.from_numpy((ends - kept_starts).astype(np.int64)),
    )


def _gather_segments(
    values: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor
) -> JaggedIds:
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, 0, out=offsets[1:])
    total = int(offsets[-1])
    shift = torch.repeat_interleave(starts - offsets[:-1], lengths, output_size=total)
    return JaggedIds(values[torch.arange(total, device=shift.device) + shift], offsets)
