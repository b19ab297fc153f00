"""ChangedIds: the ids of a table changed since its last committed checkpoint."""

from __future__ import annotations

import numpy as np
import torch
from ember.kernels.dedup import unique_inverse
from ember.kernels.id_index import IdIndex
from ember.ps_server.id_arrays import id_tensor


class ChangedIds:
    """Ids changed since the last committed checkpoint, for incremental checkpoints.

    Off until the first checkpoint (nothing to be incremental to). The ids
    changed since the last cut are a hash set (:class:`IdIndex`), so recording
    a push costs O(its ids) however many ids have changed, and memory is
    bounded by the distinct ids. :meth:`cut` takes the ids changed so far as
    the pending set of a checkpoint being written; :meth:`commit` drops them
    once that checkpoint is durable. A cut that is never committed is folded
    into the next one, so an incremental checkpoint always covers everything
    since the last committed one.
    """

    def __init__(self) -> None:
        self.tracking = False
        self._current = IdIndex()
        self._pending = np.empty(0, dtype=np.int64)

    def __len__(self) -> int:
        """Distinct ids changed since the last cut (not counting a pending cut's)."""
        return len(self._current)

    def add(self, ids: np.ndarray) -> None:
        """Record that the rows of ``ids`` changed."""
        if not self.tracking or len(ids) == 0:
            return
        keys = id_tensor(ids)
        new = unique_inverse(keys[self._current.find(keys) < 0])[0]
        self._current.insert(new, torch.zeros(len(new), dtype=torch.int64))

    def cut(self) -> np.ndarray:
        """Distinct ids changed since the last committed checkpoint, ascending; starts tracking."""
        changed = self._current.items()[0].numpy()
        self._pending = np.union1d(self._pending, changed)
        self._current = IdIndex()
        self.tracking = True
        return self._pending

    def commit(self) -> None:
        """The last cut's checkpoint is durable: forget its ids."""
        self._pending = np.empty(0, dtype=np.int64)

    def reset(self) -> None:
        """Start tracking from an empty set (after a restore or a full checkpoint's cut)."""
        self._current = IdIndex()
        self._pending = np.empty(0, dtype=np.int64)
        self.tracking = True
