"""InMemoryStore: a table's rows on one shard, in process memory.

Three growable arrays (weights, state, versions: :class:`ReservedRows`, which
grow without copying) indexed by slot and an :class:`IdIndex` from id to
slot, so a table costs close to the raw bytes of its rows and optimizer
state; optimizer steps run in place with the fused op.
Evicted rows leave their slots on a free stack that later inserts reuse.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
from ember.kernels.hash_map import hash_gather_joined
from ember.kernels.hashed_init import HashedInit
from ember.kernels.id_index import IdIndex
from ember.kernels.loader import native_backend_for
from ember.kernels.optim import RowOptimizer, fused_row_update
from ember.kernels.rows import gather_rows, scatter_rows
from ember.kernels.upsert import TableUpsert, upsert_row_updates
from ember.ps_server.id_arrays import id_tensor
from ember.ps_server.stores.base import (
    DUMP_CHUNK_ROWS,
    InitialRows,
    RowBatch,
    RowFactory,
    empty_batch,
)
from ember.ps_server.stores.reserved_rows import ReservedRows, rows_in_memory


class InMemoryStore:
    """Rows of one table on one shard, in process memory (the ``memory`` store).

    Args:
        dim: floats per row.
        state_width: optimizer-state floats per row.
        capacity: initial number of row slots (grows in place).
    """

    def __init__(self, dim: int, state_width: int, capacity: int = 1024) -> None:
        self.dim = dim
        self.state_width = state_width
        self._index = IdIndex(capacity)
        self._rows = 0  # live rows
        self._slots_used = 0  # slots ever handed out: live rows plus free ones
        self._free = torch.empty(0, dtype=torch.int64)  # slots of evicted rows, reused first
        reserve = rows_in_memory(4 * (dim + state_width) + 8)  # one length for all three
        self._arrays = (
            ReservedRows((dim,), torch.float32, capacity, reserve),
            ReservedRows((state_width,), torch.float32, capacity, reserve),
            ReservedRows((), torch.int64, capacity, reserve),
        )
        self._bind()

    def size(self) -> int:
        """Number of rows held."""
        return self._rows

    @property
    def slot_count(self) -> int:
        """Slots handed out so far (every slot :meth:`locate` returns is below it)."""
        return self._slots_used

    def locate(self, ids: np.ndarray) -> torch.Tensor:
        """The slot of each id, -1 where absent; a row keeps its slot until evicted."""
        return self._index.find(id_tensor(ids))

    def footprint(self) -> tuple[int, int]:
        """``(rows, bytes)`` held (see :attr:`nbytes`)."""
        return self._rows, self.nbytes

    @property
    def nbytes(self) -> int:
        """Bytes of the rows held, their state, versions and index buckets."""
        per_row = 4 * (self.dim + self.state_width) + 8
        return self._rows * per_row + self._index.nbytes

    def items(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The ids held and their slots."""
        return self._index.items()

    def flush(self) -> None:
        """Nothing to do: the rows live here."""

    def fetch(self, ids: np.ndarray, with_state: bool = True) -> tuple[np.ndarray, RowBatch]:
        """Look up rows by id (duplicates allowed).

        Returns:
            ``(found, rows)``: a bool mask over ``ids`` and a batch of len(ids)
            rows whose entries where ``found`` is false are unspecified. The
            state is empty (width 0) unless ``with_state``.
        """
        slots = self.locate(ids)
        found = (slots >= 0).numpy()
        if not self._rows:
            return found, empty_batch(len(ids), self.dim, self.state_width if with_state else 0)
        index = slots.clamp(min=0)  # absent ids read slot 0
        rows = RowBatch(
            weights=_take(self._weights, index),
            state=_take(self._state, index) if with_state else torch.empty(len(ids), 0),
            versions=_take(self._versions, index),
        )
        return found, rows

    def fetch_weights(self, ids: np.ndarray, out: torch.Tensor) -> np.ndarray:
        """Weights of held ``ids`` into ``out``; returns the positions of absent ids."""
        return self._index.gather(id_tensor(ids), self._weights, out).numpy()

    def reads_natively(self) -> bool:
        """Whether :meth:`fetch_weights` and :meth:`fetch_state` can join other stores' in
        :func:`fetch_weights_joined` and :func:`fetch_state_joined`."""
        return native_backend_for(self._weights)

    def fetch_state(self, ids: np.ndarray, state: torch.Tensor) -> torch.Tensor:
        """Versions of ``ids``, their optimizer state written into ``state``; 0 where absent:
        no weights read, one gather per array."""
        keys = id_tensor(ids)
        versions = torch.empty(len(ids), 1, dtype=torch.int64)
        absent = self._index.gather(keys, self._versions.view(-1, 1), versions)
        if self.state_width:
            self._index.gather(keys, self._state, state)
        if len(absent):
            versions[absent], state[absent] = 0, 0.0
        return versions.view(-1)

    def fetch_versions(self, ids: np.ndarray) -> tuple[np.ndarray, torch.Tensor]:
        """``(found, versions)`` of ``ids``: a bool mask and each row's version (0 where absent)."""
        slots = self.locate(ids)
        found = slots >= 0
        versions = (
            _take(self._versions, slots.clamp(min=0)) if self._rows else torch.zeros_like(slots)
        )
        return found.numpy(), versions.masked_fill_(~found, 0)

    def absent(self, ids: np.ndarray) -> np.ndarray:
        """A bool mask over ``ids``: true where the store holds no row."""
        return (self.locate(ids) < 0).numpy()

    def update(
        self,
        ids: np.ndarray,
        grads: torch.Tensor,
        optimizer: RowOptimizer,
        create: RowFactory | None = None,
    ) -> None:
        """Step the rows of distinct ``ids`` with their summed ``grads``, in place.

        Each row's version goes up by one (Adam's t). Absent rows are first
        made by ``create``; without it an absent id raises KeyError, changing
        nothing.
        """
        if self.steps_natively(create):
            update_stores([(self, ids, grads, optimizer, create.hashed)])
            return
        slots = self.locate(ids)
        missing = slots < 0
        if bool(missing.any()):
            if create is None:
                raise KeyError(f"update of {int(missing.sum())} ids the store does not hold")
            new_ids = ids[missing.numpy()]
            rows = create(new_ids)
            new_slots = self._claim(id_tensor(new_ids))
            self._scatter(new_slots, rows)
            slots[missing] = new_slots
        fused_row_update(optimizer, self._weights, self._state, self._versions, slots, grads)

    def steps_natively(self, create: RowFactory | None) -> bool:
        """Whether :meth:`update` with ``create`` runs in one native pass (it can then join
        other stores' in :func:`update_stores`)."""
        return (
            isinstance(create, InitialRows)
            and create.hashed is not None
            and native_backend_for(self._weights)
        )

    def _upsert(
        self, ids: torch.Tensor, grads: torch.Tensor, optimizer: RowOptimizer, init: HashedInit
    ) -> TableUpsert:
        """This store's part of a native pass (its arrays as they are now)."""
        arrays = (self._weights, self._state, self._versions)
        return TableUpsert(
            self._index, arrays, ids, grads, self._free, self._slots_used, init, optimizer
        )

    def _took(self, absent: int, reused: int) -> None:
        """Count a native pass's ``absent`` new rows, ``reused`` of them in free slots."""
        self._free = self._free[: len(self._free) - reused]
        self._slots_used += absent - reused
        self._rows += absent
        if absent > reused:  # the arrays learn their size (huge pages past a threshold)
            self._grow(self._slots_used)

    def insert(self, ids: np.ndarray, rows: RowBatch) -> None:
        """Write rows for distinct ids, adding those that are absent (upsert)."""
        self._write(id_tensor(ids), rows)

    def evict(self, ids: np.ndarray) -> None:
        """Drop the rows of distinct ``ids``; their slots go to the free stack."""
        erased = self._index.erase(id_tensor(ids))
        freed = erased[erased >= 0]
        self._rows -= len(freed)
        self._free = torch.cat([self._free, freed])

    def dump(self, chunk_rows: int = DUMP_CHUNK_ROWS) -> Iterator[tuple[np.ndarray, RowBatch]]:
        """Every row as ``(ids, rows)`` chunks (a snapshot of the ids; rows read per chunk)."""
        ids, slots = self.items()
        for start in range(0, len(ids), chunk_rows):
            index = slots[start : start + chunk_rows]
            yield (
                ids[start : start + chunk_rows].numpy(),
                RowBatch(
                    weights=_take(self._weights, index),
                    state=_take(self._state, index),
                    versions=_take(self._versions, index),
                ),
            )

    def clear(self) -> None:
        """Drop every row (the buffers keep their capacity)."""
        self._index = IdIndex(1024)
        self._rows = self._slots_used = 0
        self._free = torch.empty(0, dtype=torch.int64)

    def _write(self, id_batch: torch.Tensor, rows: RowBatch) -> torch.Tensor:
        """Upsert the rows of distinct ids; returns their slots."""
        index = self._index.find(id_batch)
        absent = index < 0
        if bool(absent.any()):
            index[absent] = self._claim(id_batch[absent])
        self._scatter(index, rows)
        return index

    def _claim(self, id_batch: torch.Tensor) -> torch.Tensor:
        """Slots for distinct ids the index does not hold, entered in it; returns them."""
        new_slots = self._allocate(len(id_batch))
        self._index.insert(id_batch, new_slots)
        self._rows += len(new_slots)
        return new_slots

    def _scatter(self, slots: torch.Tensor, rows: RowBatch) -> None:
        scatter_rows(self._weights, slots, rows.weights.contiguous())
        if self.state_width:
            scatter_rows(self._state, slots, rows.state.contiguous())
        scatter_rows(self._versions, slots, rows.versions.contiguous())

    def _allocate(self, count: int) -> torch.Tensor:
        """``count`` free slots: reused ones first, then new ones (growing the buffers)."""
        reused = self._free[len(self._free) - min(count, len(self._free)) :]
        self._free = self._free[: len(self._free) - len(reused)]
        fresh = count - len(reused)
        if fresh:
            self._grow(self._slots_used + fresh)
            new = torch.arange(self._slots_used, self._slots_used + fresh, dtype=torch.int64)
            self._slots_used += fresh
            return torch.cat([reused, new])
        return reused.clone()

    def reserve(self, rows: int) -> None:
        """Size the index and the arrays for ``rows`` rows in all (a restore knows how many
        are coming: no rehash, and the checkpoint's bucket order inserts sequentially)."""
        self._index.reserve(rows)
        self._grow(rows)

    def _grow(self, slots: int) -> None:
        for array in self._arrays:  # each also learns its size (huge pages past a threshold)
            array.ensure(slots, self._slots_used)
        if slots > len(self._weights):
            self._bind()

    def _bind(self) -> None:
        """Name the arrays' current tensors (growing may replace them), cut to one length
        (the fused ops index them together; a refused reservation leaves one shorter)."""
        rows = min(array.capacity for array in self._arrays)
        self._weights, self._state, self._versions = (a.tensor[:rows] for a in self._arrays)


# One store's write in :func:`update_stores`: the store, distinct ids, their summed
# gradients, the table's optimizer and the native form of its initial rows.
StoreUpdate = tuple[InMemoryStore, np.ndarray, torch.Tensor, RowOptimizer, HashedInit]


def update_stores(updates: Sequence[StoreUpdate]) -> None:
    """:meth:`InMemoryStore.update` of several stores (one table each, every one
    :meth:`~InMemoryStore.steps_natively`) in one native pass, all or none of them.
    Where some store's absent rows do not fit, nothing is written, every store grows to
    what its absent rows need (as the separate ops would grow it; one with room already
    stays as it is), and the pass runs again.

    Raises:
        ValueError: a store given twice.
        RuntimeError: bad arguments (see :func:`upsert_row_updates`); nothing is written.
    """
    if not updates:
        return
    inputs = [(id_tensor(ids), grads.contiguous()) for _, ids, grads, _, _ in updates]
    for _ in range(2):
        parts = [
            store._upsert(ids, grads, optimizer, init)
            for (store, _, _, optimizer, init), (ids, grads) in zip(updates, inputs)
        ]
        answers, applied = upsert_row_updates(parts)
        for (store, *_), (absent, reused) in zip(updates, answers):
            if applied:
                store._took(absent, reused)
            else:  # the index is sized already
                store._grow(store._slots_used + absent - reused)
        if applied:
            return
    raise AssertionError("unreachable: the second pass has room for the absent rows")


# One store's read in :func:`fetch_weights_joined`: the store, the ids (an int64 tensor)
# and the byte of the flat output where their rows start.
StoreRead = tuple[InMemoryStore, torch.Tensor, int]
# One store's read in :func:`fetch_state_joined`: the store, the ids (an int64 tensor),
# and the bytes of the flat output where their versions and their state start.
StoreStateRead = tuple[InMemoryStore, torch.Tensor, int, int]


def fetch_weights_joined(reads: Sequence[StoreRead], out: torch.Tensor) -> list[torch.Tensor]:
    """:meth:`InMemoryStore.fetch_weights` of several stores (each
    :meth:`~InMemoryStore.reads_natively`) in one native pass into the flat uint8 ``out``:
    each read's rows as host-order float32 bytes from its offset on (ascending, not
    overlapping, any alignment); returns each read's absent positions (their rows
    untouched).

    Raises:
        RuntimeError: reads that do not fit ``out`` (see :func:`hash_gather_joined`);
            ``out`` is then untouched.
    """
    return hash_gather_joined(
        [store._index.buckets for store, _, _ in reads],
        [store._weights for store, _, _ in reads],
        [ids for _, ids, _ in reads],
        [offset for _, _, offset in reads],
        out,
    )


def fetch_state_joined(reads: Sequence[StoreStateRead], out: torch.Tensor) -> list[torch.Tensor]:
    """:meth:`InMemoryStore.fetch_state` of several stores (each
    :meth:`~InMemoryStore.reads_natively`) in one native pass into the flat uint8 ``out``:
    each read's rows' versions (host-order int64) and their state (host-order float32, the
    store's width per row) from their offsets on; returns each read's absent positions
    (their versions and state untouched).

    Raises:
        RuntimeError: as :func:`fetch_weights_joined`; ``out`` is then untouched.
    """
    maps, srcs, ids, offsets, first_of_read = [], [], [], [], []
    for store, keys, versions_at, state_at in reads:
        first_of_read.append(len(maps))
        parts = [(store._versions.view(-1, 1), versions_at)]
        if store.state_width:
            parts.append((store._state, state_at))
        for src, start in parts:
            maps.append(store._index.buckets)
            srcs.append(src)
            ids.append(keys)
            offsets.append(start)
    absent = hash_gather_joined(maps, srcs, ids, offsets, out)
    return [absent[first] for first in first_of_read]


def _take(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    out = torch.empty((len(index), *table.shape[1:]), dtype=table.dtype)
    return gather_rows(table, index, out) if out.numel() else out
