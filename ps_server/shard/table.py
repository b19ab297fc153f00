"""One embedding table on one shard: pull and push semantics over a store.

All reads and writes of a table hold its lock, so concurrent clients never see
a torn row and never lose an update; a push is validated by the caller and
applied here as one unit. A step's passes over several tables at once
(:mod:`ember.ps_server.shard.table_passes`) hold those tables' locks together and
keep each table's bookkeeping through its private methods, as its own would.
"""

from __future__ import annotations

import collections
import functools
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from ember.kernels.optim import state_width
from ember.ps_server.durability.checkpoint_format import FileEntry, write_row_file
from ember.ps_server.id_arrays import sum_duplicates
from ember.ps_server.shard.changed_ids import ChangedIds
from ember.ps_server.shard.initializers import hashed_init, initial_rows
from ember.ps_server.stores import InMemoryStore, RowBatch, RowStore
from ember.ps_server.stores.base import DUMP_CHUNK_ROWS, InitialRows, empty_batch
from ember.ps_server.wire.stats import TableCounters
from ember.ps_server.wire.table_spec import TableSpec


class Table:
    """Rows of one table on one shard, with its optimizer and push deduplication.

    Args:
        spec: validated table spec.
        store: where the rows live (default: a new in-memory store).
        dedup_window: how many recent push request ids are remembered.
    """

    def __init__(
        self, spec: TableSpec, store: RowStore | None = None, dedup_window: int = 65536
    ) -> None:
        self.spec = spec
        width = state_width(spec.optimizer.kind, spec.dim)
        self.store = InMemoryStore(spec.dim, width) if store is None else store
        self._initial_rows = InitialRows(  # the rows of ids as first written
            functools.partial(initial_rows, spec), self.store.state_width, hashed_init(spec)
        )
        self.counters = TableCounters()
        self.changes = ChangedIds()
        self._lock = threading.Lock()
        self._applied: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._dedup_window = dedup_window

    def pull(self, ids: np.ndarray, with_state: bool = False) -> RowBatch:
        """Rows, versions and (``with_state``, else width 0) state of ``ids`` in order
        (duplicates allowed).

        An id never written reads as its initial row at version 0 with zero
        state and is not stored: reads never grow the table (writes create rows).
        """
        with self._lock:
            rows = self._read(ids, with_state)
            self.counters.pull_requests += 1
            self.counters.rows_pulled += len(ids)
            return rows

    def read_weights(self, ids: np.ndarray, out: torch.Tensor | None = None) -> torch.Tensor:
        """The weights of ``ids`` in order (duplicates allowed), initial rows where absent:
        :meth:`pull` without versions or state, the read of a step lookup. Written into
        ``out`` (float32 [len(ids), dim]) when given, e.g. a slot of the reply."""
        if out is None:
            out = torch.empty(len(ids), self.spec.dim, dtype=torch.float32)
        with self._lock:
            absent = self.store.fetch_weights(ids, out) if len(ids) else np.empty(0, np.int64)
            self._count_read(len(ids))
        if len(absent):  # a pure function of the spec and the id: no lock needed
            out[torch.from_numpy(absent)] = initial_rows(self.spec, ids[absent])
        return out

    def _count_read(self, rows: int) -> None:
        """Count a read of ``rows`` rows (caller holds the lock)."""
        self.counters.pull_requests += 1
        self.counters.rows_pulled += rows

    def read_state(self, ids: np.ndarray, state: torch.Tensor) -> torch.Tensor:
        """The versions of ``ids`` in order (duplicates allowed), their optimizer state
        written into ``state`` (float32 [len(ids), state width]); 0 and zero state where
        never written: the companion of a read of the same ids, so neither counted as a
        pull nor made into initial rows.

        Raises:
            ValueError: ``state`` is not a contiguous float32 tensor of that shape (a
                store copying into it would broadcast, or write past a view).
        """
        expected = (len(ids), self.store.state_width)
        if state.dtype != torch.float32 or tuple(state.shape) != expected:
            raise ValueError(
                f"state must be float32 {expected}, not {state.dtype} {tuple(state.shape)}"
            )
        if not state.is_contiguous():
            raise ValueError("state must be contiguous")
        if len(ids) == 0:
            return torch.zeros(0, dtype=torch.int64)
        with self._lock:
            return self.store.fetch_state(ids, state)

    def pull_stale(
        self, ids: np.ndarray, held_versions: np.ndarray, bound: int
    ) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
        """The rows of ``ids`` whose version exceeds ``held_versions`` by more than ``bound``.

        Returns:
            ``(positions, rows, versions)``: positions into ``ids`` (ascending)
            of the stale rows, their current values and versions.
        """
        with self._lock:
            _, versions = self.store.fetch_versions(ids)  # absent rows are at version 0
            # Only stale rows are read: a fresh row costs its version, not its weights.
            stale = np.flatnonzero(versions.numpy() - held_versions > bound)
            rows = self._read(ids[stale], with_state=False)
            self.counters.pull_requests += 1
            self.counters.rows_pulled += len(stale)
        return stale, rows.weights, rows.versions

    def assign(
        self,
        ids: np.ndarray,
        weights: torch.Tensor,
        state: torch.Tensor | None,
        versions: torch.Tensor | None,
        request_id: str,
    ) -> bool:
        """Overwrite the weights of distinct ``ids``, their state unless None, and their versions
        unless None (else each grows by one); returns duplicate."""
        with self._lock:
            if request_id in self._applied:
                return True
            rows = self._fetch_creating(ids, with_state=True)
            rows.weights = weights
            if state is not None:
                rows.state = state
            rows.versions = rows.versions + 1 if versions is None else versions
            self.store.insert(ids, rows)
            self.changes.add(ids)
            self._remember(request_id)
            return False

    def write_snapshot(self, path: Path, incremental: bool) -> FileEntry:
        """Write every row, or only those changed since the last committed checkpoint, to ``path``.

        Holds the table's lock throughout, so rows cannot move between a
        store's tiers while they are read.
        """
        with self._lock:
            had_base = self.changes.tracking  # a table created since the base is written whole
            changed = self.changes.cut()
            chunks = self._rows_of(changed) if incremental and had_base else self.store.dump()
            return write_row_file(
                path, self.spec.name, self.spec.dim, self.store.state_width, chunks
            )

    def reserve(self, rows: int) -> None:
        """Make room for ``rows`` rows in all (a restore, before loading them)."""
        with self._lock:
            self.store.reserve(rows)

    def load(self, ids: np.ndarray, rows: RowBatch) -> None:
        """Write restored rows of distinct ``ids`` (their versions and state as given)."""
        with self._lock:
            self.store.insert(ids, rows)

    def reset(self, applied_request_ids: list[str]) -> None:
        """Drop every row; start over with this push deduplication window (before a restore)."""
        with self._lock:
            self.store.clear()
            self.changes.reset()
            self._applied = collections.OrderedDict.fromkeys(applied_request_ids)

    def applied_request_ids(self) -> list[str]:
        """The request ids in the deduplication window, oldest first."""
        with self._lock:
            return list(self._applied)

    def _rows_of(self, ids: np.ndarray) -> Iterator[tuple[np.ndarray, RowBatch]]:
        for start in range(0, len(ids), DUMP_CHUNK_ROWS):
            part = ids[start : start + DUMP_CHUNK_ROWS]
            yield part, self.store.fetch(part)[1]

    def flush(self) -> None:
        """Write rows held in front of the backing store through to it (see ``RowStore.flush``)."""
        with self._lock:
            self.store.flush()

    def footprint(self) -> tuple[int, int]:
        """``(rows, bytes)`` of the store, without the table's lock: a Redis key scan must
        not stall the table's pulls and pushes (stores make ``footprint`` safe beside them)."""
        return self.store.footprint()

    def _read(self, ids: np.ndarray, with_state: bool) -> RowBatch:
        """Rows of ``ids`` (initial rows where absent), state of width 0 unless ``with_state``;
        caller holds the lock."""
        if len(ids) == 0:
            return empty_batch(0, self.spec.dim, self.store.state_width if with_state else 0)
        found, rows = self.store.fetch(ids, with_state=with_state)
        if not found.all():
            absent = torch.from_numpy(~found)
            rows.weights[absent] = initial_rows(self.spec, ids[~found])
            rows.state[absent] = 0.0
            rows.versions[absent] = 0
        return rows

    def push(
        self, ids: np.ndarray, grads: torch.Tensor, request_id: str, distinct: bool = False
    ) -> tuple[bool, int]:
        """Apply summed gradients once per distinct id (``distinct``: the caller has summed
        them already).

        Returns:
            ``(duplicate, rows_updated)``; ``duplicate`` is true (and nothing is
            applied) when ``request_id`` was applied before.
        """
        unique_ids, summed = (ids, grads) if distinct else sum_duplicates(ids, grads)
        with self._lock:
            if self._counted_duplicate(request_id):
                return True, 0
            self.store.update(unique_ids, summed, self.spec.optimizer, create=self._initial_rows)
            self._pushed(len(ids), unique_ids, request_id)
            return False, len(unique_ids)

    def _counted_duplicate(self, request_id: str) -> bool:
        """Count a push of ``request_id``; whether it was applied before (caller holds the
        lock)."""
        self.counters.push_requests += 1
        if request_id in self._applied:
            self.counters.duplicate_pushes += 1
            return True
        return False

    def _pushed(self, rows: int, unique_ids: np.ndarray, request_id: str) -> None:
        """Record an applied push of ``rows`` gradient rows (caller holds the lock)."""
        self.changes.add(unique_ids)
        self._remember(request_id)
        self.counters.rows_pushed += rows

    def _reads_natively(self) -> bool:
        """Whether this table's reads can join a native pass over several tables."""
        store = self.store  # exactly the memory store: a subclass may read otherwise
        return type(store) is InMemoryStore and store.reads_natively()

    def _steps_natively(self) -> bool:
        """Whether this table's pushes can join a native pass over several tables."""
        store = self.store  # exactly the memory store: a subclass may write otherwise
        return type(store) is InMemoryStore and store.steps_natively(self._initial_rows)

    def _create(self, new_ids: np.ndarray) -> None:
        """Initialise and store the rows of distinct ``new_ids``."""
        self.store.insert(new_ids, self._initial_rows(new_ids))
        self.changes.add(new_ids)

    def _fetch_creating(self, ids: np.ndarray, with_state: bool) -> RowBatch:
        """The rows of ``ids`` (duplicates allowed), initialising absent ones first."""
        found, rows = self.store.fetch(ids, with_state=with_state)
        if found.all():
            return rows
        del rows  # the first fetch's buffers are reused by the second
        self._create(np.unique(ids[~found]))
        return self.store.fetch(ids, with_state=with_state)[1]

    def _remember(self, request_id: str) -> None:
        self._applied[request_id] = None
        if len(self._applied) > self._dedup_window:
            self._applied.popitem(last=False)
