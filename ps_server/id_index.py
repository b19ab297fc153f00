"""An open-addressing hash map from non-negative int64 id to row slot.

Two flat int64 arrays (keys, slots) with linear probing: 16 bytes per bucket
and no Python object per id. Probing runs in the native ``torch.ops.ember``
hash-map ops when they are available, else in the numpy reference here, which
probes a whole batch one step per loop iteration. Both use the same layout.
"""

from __future__ import annotations

import numpy as np
import torch
from ember.kernels.loader import native_ops_available
from ember.ps_server.routing import mix64

_EMPTY = -1
_INDEX_SALT = np.uint64(0x5851F42D4C957F2D)  # independent of the routing hash


class IdIndex:
    """Maps ids (int64 >= 0) to slots (int64), growing as rows are added.

    Example:
        >>> index = IdIndex()
        >>> index.insert(np.array([5, 9], dtype=np.int64), np.array([0, 1]))
        >>> index.find(np.array([9, 4], dtype=np.int64)).tolist()
        [1, -1]
    """

    MAX_LOAD = 0.7

    def __init__(self, capacity: int = 1024, native: bool | None = None) -> None:
        capacity = 1 << max(4, (max(1, capacity) - 1).bit_length())
        self._native = native_ops_available() if native is None else native
        self._keys = np.full(capacity, _EMPTY, dtype=np.int64)
        self._slots = np.empty(capacity, dtype=np.int64)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def nbytes(self) -> int:
        """Bytes held by the bucket arrays."""
        return self._keys.nbytes + self._slots.nbytes

    def _home(self, ids: np.ndarray) -> np.ndarray:
        mask = np.uint64(len(self._keys) - 1)
        return (mix64(ids.view(np.uint64) ^ _INDEX_SALT) & mask).astype(np.int64)

    def find(self, ids: np.ndarray) -> np.ndarray:
        """Slot of every id, or -1 where the id is absent. Duplicates allowed."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        if self._native:
            if not ids.flags.writeable:  # e.g. a view of request bytes; torch wants writable memory
                ids = ids.copy()
            keys, slots = torch.from_numpy(self._keys), torch.from_numpy(self._slots)
            return torch.ops.ember.hash_find(keys, slots, torch.from_numpy(ids)).numpy()
        result = np.full(len(ids), -1, dtype=np.int64)
        pending = np.arange(len(ids))
        pos = self._home(ids)
        mask = len(self._keys) - 1
        while len(pending):
            keys = self._keys[pos]
            hit = keys == ids[pending]
            result[pending[hit]] = self._slots[pos[hit]]
            go_on = ~(hit | (keys == _EMPTY))
            pending = pending[go_on]
            pos = (pos[go_on] + 1) & mask
        return result

    def insert(self, ids: np.ndarray, slots: np.ndarray) -> None:
        """Add distinct ids that are not yet present, mapping ids[i] -> slots[i]."""
        if len(ids) == 0:
            return
        self._reserve(self._size + len(ids))
        self._place(ids, np.asarray(slots, dtype=np.int64))
        self._size += len(ids)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """All (ids, slots) pairs, in bucket order."""
        used = self._keys != _EMPTY
        return self._keys[used], self._slots[used]

    def _reserve(self, size: int) -> None:
        capacity = len(self._keys)
        if size <= capacity * self.MAX_LOAD:
            return
        while size > capacity * self.MAX_LOAD:
            capacity *= 2
        ids, slots = self.items()
        self._keys = np.full(capacity, _EMPTY, dtype=np.int64)
        self._slots = np.empty(capacity, dtype=np.int64)
        self._place(ids, slots)

    def _place(self, ids: np.ndarray, slots: np.ndarray) -> None:
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        if self._native:
            keys, table_slots = torch.from_numpy(self._keys), torch.from_numpy(self._slots)
            torch.ops.ember.hash_insert(
                keys, table_slots, torch.from_numpy(ids), torch.from_numpy(slots)
            )
            return
        pending = np.arange(len(ids))
        pos = self._home(ids)
        mask = len(self._keys) - 1
        while len(pending):
            free = self._keys[pos] == _EMPTY
            # Among pending ids that found the same free bucket, the first wins.
            candidates = np.flatnonzero(free)
            _, first = np.unique(pos[candidates], return_index=True)
            winners = candidates[first]
            self._keys[pos[winners]] = ids[pending[winners]]
            self._slots[pos[winners]] = slots[pending[winners]]
            placed = np.zeros(len(pending), dtype=bool)
            placed[winners] = True
            keep = ~placed
            pending, pos = pending[keep], pos[keep]
            # Losers re-probe the same bucket (now taken) and move on next round.
            moved = self._keys[pos] != _EMPTY
            pos[moved] = (pos[moved] + 1) & mask
