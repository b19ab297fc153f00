"""TieredStore: a bounded in-memory tier of recently used rows in front of Redis.

Rows are served from the memory tier; a miss is fetched from the cold store in
one batch per request and admitted. When admitting would pass ``capacity``,
the least recently used rows that the request does not touch are evicted
first, dirty ones written back to the cold store in one transaction, so a
failure of the cold store leaves both tiers as they were. A single request
wider than ``capacity`` is admitted whole; the tier shrinks back to capacity
at the next request that needs room.

The tier's own state (the memory store and the per-slot use, dirty and
held-cold flags) changes under the store's lock, so ``footprint`` (stats)
may run beside pushes without the table's lock, and the cold store's key
scan runs outside any lock.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

import numpy as np
import torch
from ember.kernels.optim import RowOptimizer
from ember.ps_server.stores.base import (
    DUMP_CHUNK_ROWS,
    RowBatch,
    RowFactory,
    RowStore,
    weights_via_fetch,
)
from ember.ps_server.stores.memory import InMemoryStore

Method = TypeVar("Method", bound=Callable)


def _locked(method: Method) -> Method:
    """Run ``method`` under the store's lock."""

    @functools.wraps(method)
    def run(self: TieredStore, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return run  # type: ignore[return-value]


class TieredStore:
    """Rows of one table on one shard: hot rows in memory, all others in ``cold``.

    Args:
        cold: the store behind the tier (a :class:`RedisStore`).
        capacity: rows the memory tier holds after each request.
        headroom: extra fraction of ``capacity`` freed per eviction, so the
            scan for victims runs once per that many misses, not per miss.

    Attributes:
        hits, misses: row lookups served by the memory tier / fetched from cold.
    """

    def __init__(self, cold: RowStore, capacity: int, headroom: float = 1 / 32) -> None:
        if capacity < 1:
            raise ValueError(f"tiered store capacity must be >= 1 row, got {capacity}")
        self.dim, self.state_width = cold.dim, cold.state_width
        self.capacity = capacity
        self.hits = self.misses = 0
        self._cold = cold
        self._hot = InMemoryStore(self.dim, self.state_width, capacity=min(capacity, 1 << 16))
        self._headroom = max(1, int(capacity * headroom))
        self._lock = threading.RLock()
        self._clock = 0
        # Per hot slot: last use (clock), written since admitted, held by the cold store.
        self._last_use = torch.zeros(0, dtype=torch.int64)
        self._dirty = torch.zeros(0, dtype=torch.bool)
        self._in_cold = torch.zeros(0, dtype=torch.bool)

    def footprint(self) -> tuple[int, int]:
        """``(rows, bytes)``: rows as :meth:`size` counts them, bytes of both tiers; one cold
        scan, outside the lock (safe beside other calls; a moment's rows may be counted twice)."""
        with self._lock:
            hot_rows, hot_bytes = self._hot_only(), self._hot.nbytes
        cold_rows, cold_bytes = self._cold.footprint()
        return cold_rows + hot_rows, hot_bytes + cold_bytes

    @property
    def resident(self) -> int:
        """Rows in the memory tier."""
        return self._hot.size()

    def size(self) -> int:
        """Rows held: all of the cold store's plus hot rows not yet written to it."""
        return self.footprint()[0]

    def _hot_only(self) -> int:
        """Hot rows the cold store does not hold yet."""
        _, slots = self._hot_items()
        return int((~self._in_cold[slots]).sum())

    @_locked
    def fetch(self, ids: np.ndarray, with_state: bool = True) -> tuple[np.ndarray, RowBatch]:
        """``(found mask, rows)`` of ``ids`` (duplicates allowed), admitting cold rows."""
        self._admit(np.unique(ids), create=None)
        return self._hot.fetch(ids, with_state)

    def fetch_weights(self, ids: np.ndarray, out: torch.Tensor) -> np.ndarray:
        """Weights of held ``ids`` into ``out``; returns the positions of absent ids."""
        return weights_via_fetch(self, ids, out)

    @_locked
    def fetch_state(self, ids: np.ndarray, state: torch.Tensor) -> torch.Tensor:
        """Versions of ``ids``, their state written into ``state``; 0 where absent, admitting
        cold rows."""
        self._admit(np.unique(ids), create=None)
        return self._hot.fetch_state(ids, state)

    def fetch_versions(self, ids: np.ndarray) -> tuple[np.ndarray, torch.Tensor]:
        """``(found mask, versions)``, 0 where absent."""
        found, rows = self.fetch(ids, with_state=False)
        return found, rows.versions.masked_fill_(torch.from_numpy(~found), 0)

    @_locked
    def absent(self, ids: np.ndarray) -> np.ndarray:
        """True where neither tier holds the row."""
        absent = self._hot.absent(ids)
        if absent.any():
            absent[absent] = self._cold.absent(ids[absent])
        return absent

    @_locked
    def insert(self, ids: np.ndarray, rows: RowBatch) -> None:
        """Write rows of distinct ``ids`` into the memory tier (dirty until written back)."""
        slots = self._hot.locate(ids)
        new = (slots < 0).numpy()
        in_cold = ~self._cold.absent(ids[new]) if new.any() else new[:0]
        self._make_room(int(new.sum()), keep=slots[slots >= 0])
        self._hot.insert(ids, rows)
        slots = self._hot.locate(ids)
        self._mark(slots, dirty=True)
        self._in_cold[slots[torch.from_numpy(new)]] = torch.from_numpy(in_cold)

    @_locked
    def update(
        self,
        ids: np.ndarray,
        grads: torch.Tensor,
        optimizer: RowOptimizer,
        create: RowFactory | None = None,
    ) -> None:
        """One optimizer step on the rows of distinct ``ids``, in the memory tier."""
        slots = self._admit(ids, create)
        if bool((slots < 0).any()):
            raise KeyError(f"update of {int((slots < 0).sum())} ids the store does not hold")
        self._hot.update(ids, grads, optimizer)
        self._mark(slots, dirty=True)

    @_locked
    def evict(self, ids: np.ndarray) -> None:
        """Drop the rows of distinct ``ids`` from both tiers."""
        self._cold.evict(ids)
        self._hot.evict(ids)

    def dump(self, chunk_rows: int = DUMP_CHUNK_ROWS) -> Iterator[tuple[np.ndarray, RowBatch]]:
        """Every row: the memory tier's, then the cold rows it does not shadow."""
        yield from self._hot.dump(chunk_rows)
        for ids, rows in self._cold.dump(chunk_rows):
            cold_only = (self._hot.locate(ids) < 0).numpy()
            if cold_only.all():
                yield ids, rows
            elif cold_only.any():
                yield ids[cold_only], rows.select(cold_only)

    @_locked
    def clear(self) -> None:
        """Drop every row from both tiers."""
        self._cold.clear()
        self._hot.clear()

    def reserve(self, rows: int) -> None:
        """Nothing to do: the memory tier holds its capacity, Redis sizes itself."""

    @_locked
    def flush(self) -> None:
        """Write every dirty hot row to the cold store (the rows stay resident)."""
        ids, slots = self._hot_items()
        dirty = self._dirty[slots]
        if bool(dirty.any()):
            dirty_ids = ids[dirty.numpy()]
            self._cold.insert(dirty_ids, self._hot.fetch(dirty_ids)[1])
            self._dirty[slots[dirty]] = False
            self._in_cold[slots[dirty]] = True

    def _admit(self, ids: np.ndarray, create: RowFactory | None) -> torch.Tensor:
        """Make the rows of distinct ``ids`` resident; returns their slots (-1: held nowhere).

        Rows that neither tier holds are made by ``create`` when given.
        """
        slots = self._hot.locate(ids)
        missing = (slots < 0).numpy()
        self.misses += int(missing.sum())
        self.hits += len(ids) - int(missing.sum())
        if not missing.any():
            self._mark(slots, dirty=False)
            return slots
        miss_ids = ids[missing]
        found, rows = self._cold.fetch(miss_ids)  # may raise: nothing has changed yet
        admitted = found
        if create is not None and not found.all():
            rows.fill(~found, create(miss_ids[~found]))
            admitted = np.ones(len(miss_ids), dtype=bool)
        self._make_room(int(admitted.sum()), keep=slots[slots >= 0])
        if admitted.any():
            self._hot.insert(miss_ids[admitted], rows.select(admitted))
            new_slots = self._hot.locate(miss_ids[admitted])
            self._mark(new_slots, dirty=False)
            self._dirty[new_slots] = torch.from_numpy(~found[admitted])
            self._in_cold[new_slots] = torch.from_numpy(found[admitted])
        slots = self._hot.locate(ids)
        self._mark(slots[slots >= 0], dirty=False)
        return slots

    def _make_room(self, incoming: int, keep: torch.Tensor) -> None:
        """Evict least recently used rows (not in ``keep``) so ``incoming`` more fit."""
        excess = self._hot.size() + incoming - self.capacity
        if excess <= 0:
            return
        self._clock += 1
        self._grow_slot_arrays()
        self._last_use[keep] = self._clock
        ids, slots = self._hot_items()
        candidates = (self._last_use[slots] < self._clock).nonzero().flatten()
        count = min(len(candidates), excess + self._headroom)
        if count == 0:
            return
        oldest = torch.topk(self._last_use[slots[candidates]], count, largest=False).indices
        victims = candidates[oldest]
        victim_ids, victim_slots = ids[victims].numpy(), slots[victims]
        dirty = self._dirty[victim_slots].numpy()
        if dirty.any():  # written back before anything is dropped
            self._cold.insert(victim_ids[dirty], self._hot.fetch(victim_ids[dirty])[1])
        self._hot.evict(victim_ids)
        self._dirty[victim_slots] = False

    def _mark(self, slots: torch.Tensor, dirty: bool) -> None:
        """Record a use of hot ``slots`` (and that they changed, when ``dirty``)."""
        self._clock += 1
        self._grow_slot_arrays()
        self._last_use[slots] = self._clock
        if dirty:
            self._dirty[slots] = True

    def _grow_slot_arrays(self) -> None:
        slots = self._hot.slot_count
        if slots <= len(self._last_use):
            return
        extra = max(slots, 2 * len(self._last_use)) - len(self._last_use)
        self._last_use = torch.cat([self._last_use, torch.zeros(extra, dtype=torch.int64)])
        self._dirty = torch.cat([self._dirty, torch.zeros(extra, dtype=torch.bool)])
        self._in_cold = torch.cat([self._in_cold, torch.zeros(extra, dtype=torch.bool)])

    def _hot_items(self) -> tuple[torch.Tensor, torch.Tensor]:
        self._grow_slot_arrays()
        return self._hot.items()
