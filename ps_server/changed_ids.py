"""ChangedIds: the ids of a table changed since its last committed checkpoint."""

from __future__ import annotations

import numpy as np

_COMPACT_AT = 1 << 22  # ids held before duplicates are folded away


class ChangedIds:
    """Ids changed since the last committed checkpoint, for incremental checkpoints.

    Off until the first checkpoint (nothing to be incremental to). :meth:`cut`
    takes the ids changed so far as the pending set of a checkpoint being
    written; :meth:`commit` drops them once that checkpoint is durable. A cut
    that is never committed is folded into the next one, so an incremental
    checkpoint always covers everything since the last committed one.
    """

    def __init__(self) -> None:
        self.tracking = False
        self._current: list[np.ndarray] = []
        self._held = 0
        self._pending = np.empty(0, dtype=np.int64)

    def add(self, ids: np.ndarray) -> None:
        """Record that the rows of ``ids`` changed."""
        if not self.tracking or len(ids) == 0:
            return
        self._current.append(np.array(ids, dtype=np.int64))
        self._held += len(ids)
        if self._held > _COMPACT_AT:
            self._current = [np.unique(np.concatenate(self._current))]
            self._held = len(self._current[0])

    def cut(self) -> np.ndarray:
        """Distinct ids changed since the last committed checkpoint; starts tracking."""
        self._pending = np.unique(np.concatenate([self._pending, *self._current]))
        self._current, self._held = [], 0
        self.tracking = True
        return self._pending

    def commit(self) -> None:
        """The last cut's checkpoint is durable: forget its ids."""
        self._pending = np.empty(0, dtype=np.int64)

    def reset(self) -> None:
        """Start tracking from an empty set (after a restore or a full checkpoint's cut)."""
        self._current, self._held = [], 0
        self._pending = np.empty(0, dtype=np.int64)
        self.tracking = True
