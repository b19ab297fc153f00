"""InMemoryStore: a table's rows on one shard, in process memory.

Three growable tensors (weights, state, versions) indexed by slot and an
:class:`IdIndex` from id to slot, so a table costs close to the raw bytes of
its rows and optimizer state; optimizer steps run in place with the fused op.
"""

from __future__ import annotations

import numpy as np
import torch
from ember.kernels.id_index import IdIndex
from ember.kernels.optim import RowOptimizer, fused_row_update
from ember.kernels.rows import gather_rows, scatter_rows
from ember.ps_server.id_arrays import id_tensor
from ember.ps_server.stores.base import RowBatch, empty_batch


class InMemoryStore:
    """Rows of one table on one shard, in process memory (the ``memory`` store).

    Args:
        dim: floats per row.
        state_width: optimizer-state floats per row.
        capacity: initial number of row slots (grows by doubling).
    """

    def __init__(self, dim: int, state_width: int, capacity: int = 1024) -> None:
        self.dim = dim
        self.state_width = state_width
        self._index = IdIndex(capacity)
        self._rows = 0
        self._weights = torch.empty(capacity, dim, dtype=torch.float32)
        self._state = torch.empty(capacity, state_width, dtype=torch.float32)
        self._versions = torch.empty(capacity, dtype=torch.int64)

    def size(self) -> int:
        """Number of rows held."""
        return self._rows

    @property
    def nbytes(self) -> int:
        """Bytes of the rows held, their state, versions and index buckets."""
        per_row = 4 * (self.dim + self.state_width) + 8
        return self._rows * per_row + self._index.nbytes

    def fetch(self, ids: np.ndarray, with_state: bool = True) -> tuple[np.ndarray, RowBatch]:
        """Look up rows by id (duplicates allowed).

        Returns:
            ``(found, rows)``: a bool mask over ``ids`` and a batch of len(ids)
            rows whose entries where ``found`` is false are unspecified. The
            state is empty (width 0) unless ``with_state``.
        """
        slots = self._index.find(id_tensor(ids))
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

    def fetch_versions(self, ids: np.ndarray) -> tuple[np.ndarray, torch.Tensor]:
        """``(found, versions)`` of ``ids``: a bool mask and each row's version (0 where absent)."""
        slots = self._index.find(id_tensor(ids))
        found = slots >= 0
        versions = (
            _take(self._versions, slots.clamp(min=0)) if self._rows else torch.zeros_like(slots)
        )
        return found.numpy(), versions.masked_fill_(~found, 0)

    def absent(self, ids: np.ndarray) -> np.ndarray:
        """A bool mask over ``ids``: true where the store holds no row."""
        return (self._index.find(id_tensor(ids)) < 0).numpy()

    def update(self, ids: np.ndarray, grads: torch.Tensor, optimizer: RowOptimizer) -> None:
        """Step the rows of distinct, present ``ids`` with their summed ``grads``, in place.

        Each row's version goes up by one (Adam's t). Raises KeyError, changing
        nothing, if an id is absent.
        """
        slots = self._index.find(id_tensor(ids))
        if bool((slots < 0).any()):
            raise KeyError(f"update of {int((slots < 0).sum())} ids the store does not hold")
        fused_row_update(optimizer, self._weights, self._state, self._versions, slots, grads)

    def insert(self, ids: np.ndarray, rows: RowBatch) -> None:
        """Write rows for distinct ids, adding those that are absent (upsert)."""
        id_batch = id_tensor(ids)
        index = self._index.find(id_batch)
        absent = index < 0
        if bool(absent.any()):
            count = int(absent.sum())
            new_slots = torch.arange(self._rows, self._rows + count, dtype=torch.int64)
            self._grow(self._rows + count)
            self._index.insert(id_batch[absent], new_slots)
            self._rows += count
            index[absent] = new_slots
        scatter_rows(self._weights, index, rows.weights.contiguous())
        if self.state_width:
            scatter_rows(self._state, index, rows.state.contiguous())
        scatter_rows(self._versions, index, rows.versions.contiguous())

    def _grow(self, rows: int) -> None:
        capacity = len(self._weights)
        if rows <= capacity:
            return
        while capacity < rows:
            capacity *= 2
        self._weights = _resized(self._weights, capacity, self._rows)
        self._state = _resized(self._state, capacity, self._rows)
        self._versions = _resized(self._versions, capacity, self._rows)


def _take(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    out = torch.empty((len(index), *table.shape[1:]), dtype=table.dtype)
    return gather_rows(table, index, out) if out.numel() else out


def _resized(tensor: torch.Tensor, capacity: int, used: int) -> torch.Tensor:
    grown = torch.empty((capacity, *tensor.shape[1:]), dtype=tensor.dtype)
    grown[:used] = tensor[:used]
    return grown
