"""IdIndex: a growable id -> slot map over the batched hash-map ops.

Two flat int64 tensors (keys, slots), 16 bytes per bucket and no Python object
per id, on the CPU or a CUDA device. The probing runs in the native
``torch.ops.ember`` hash-map ops when they serve the device, else in the
pure-torch reference (same layout). Erased ids leave tombstones; the index
rehashes when live ids plus tombstones pass the load factor.
"""

from __future__ import annotations

import torch
from ember.kernels.hash_map import EMPTY, hash_erase, hash_find, hash_gather_rows, hash_insert


class IdIndex:
    """Maps ids (int64 >= 0) to slots (int64), growing as ids are added.

    Args:
        capacity: ids the index should hold before its first rehash.
        device: where the buckets live.

    Example:
        >>> index = IdIndex()
        >>> index.insert(torch.tensor([5, 9]), torch.tensor([0, 1]))
        >>> index.find(torch.tensor([9, 4])).tolist()
        [1, -1]
        >>> index.erase(torch.tensor([5])).tolist()
        [0]
    """

    MAX_LOAD = 0.7

    def __init__(self, capacity: int = 1024, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        buckets = _buckets_for(max(1, capacity), self.MAX_LOAD)
        self._keys = torch.full((buckets,), EMPTY, dtype=torch.int64, device=self.device)
        self._slots = torch.empty(buckets, dtype=torch.int64, device=self.device)
        self._size = 0
        self._used = 0  # live ids plus tombstones

    def __len__(self) -> int:
        return self._size

    @property
    def nbytes(self) -> int:
        """Bytes held by the bucket arrays."""
        return 2 * self._keys.numel() * 8

    def find(self, ids: torch.Tensor) -> torch.Tensor:
        """Slot of every id, or -1 where the id is absent. Duplicates allowed."""
        return hash_find(self._keys, self._slots, ids)

    def gather(self, ids: torch.Tensor, src: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out[i] = src[slot of ids[i]]`` where present; returns the positions of absent ids
        (their rows of ``out`` untouched). See :func:`hash_gather_rows`."""
        return hash_gather_rows(self._keys, self._slots, src, ids, out)

    def insert(self, ids: torch.Tensor, slots: torch.Tensor) -> None:
        """Add distinct ids that are not yet present, mapping ids[i] -> slots[i].

        Raises:
            RuntimeError: an id is negative, already present or repeated (nothing is added).
        """
        if len(ids) == 0:
            return
        self._reserve(self._used + len(ids))
        hash_insert(self._keys, self._slots, ids, slots.to(torch.int64))
        self._size += len(ids)
        self._used += len(ids)

    @property
    def buckets(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The bucket arrays ``(keys, slots)``, for a native op that inserts ids itself
        (it then reports them: :meth:`added`)."""
        return self._keys, self._slots

    @property
    def room(self) -> int:
        """Ids an insert into :attr:`buckets` may add before the index must rehash."""
        return self._load_limit() - self._used

    def added(self, count: int) -> None:
        """Count ``count`` ids a native op inserted into :attr:`buckets` (at most :attr:`room`)."""
        if not 0 <= count <= self.room:
            raise ValueError(f"{count} ids added, room for {self.room}")
        self._size += count
        self._used += count

    def make_room(self, count: int) -> None:
        """Size the buckets so that :attr:`room` is at least ``count`` (which may rehash and
        so replace :attr:`buckets`)."""
        self._reserve(self._used + count)

    def reserve(self, count: int) -> None:
        """Size the buckets for ``count`` ids in all: no rehash until more are added."""
        self._reserve(max(count, self._used))

    def erase(self, ids: torch.Tensor) -> torch.Tensor:
        """Remove distinct ids; returns the slot each held, -1 for absent ids."""
        erased = hash_erase(self._keys, self._slots, ids)
        removed = int((erased >= 0).sum())
        self._size -= removed
        return erased

    def items(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All (ids, slots) pairs, in bucket order."""
        live = self._keys >= 0
        return self._keys[live], self._slots[live]

    def _load_limit(self) -> int:
        """Live ids plus tombstones the buckets hold before a rehash."""
        return int(len(self._keys) * self.MAX_LOAD)

    def _reserve(self, used: int) -> None:
        if used <= self._load_limit():
            return
        ids, slots = self.items()
        live = used - (self._used - self._size)
        if self._used > self._size:
            # Tombstones: leave a quarter of the load allowance free, so that rehashes
            # under insert/erase churn stay at least that many inserts apart.
            live = int(live / 0.75) + 1
        buckets = _buckets_for(live, self.MAX_LOAD)
        self._keys = torch.full((buckets,), EMPTY, dtype=torch.int64, device=self.device)
        self._slots = torch.empty(buckets, dtype=torch.int64, device=self.device)
        self._used = self._size
        hash_insert(self._keys, self._slots, ids, slots)


def _buckets_for(ids: int, max_load: float) -> int:
    """The smallest power of two (>= 16) of buckets holding ``ids`` at ``max_load``."""
    buckets = 16
    while ids > buckets * max_load:
        buckets *= 2
    return buckets
