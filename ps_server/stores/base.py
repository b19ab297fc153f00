"""What every row store holds and speaks.

A store keeps the rows of one table on one shard, each row with its optimizer
state and version, and answers in batches: ``fetch``, ``fetch_weights``,
``fetch_versions``, ``fetch_state``, ``absent``, ``insert`` (upsert), ``update``
(one optimizer step, creating absent rows on request), ``evict``, ``dump``
(every row, in chunks), ``clear``, ``flush``, ``reserve`` and ``size``.
Backends: ``memory`` (:class:`InMemoryStore`), ``redis`` (:class:`RedisStore`)
and ``tiered`` (:class:`TieredStore`), chosen by URL in
:func:`ember.ps_server.stores.open_store`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Protocol

import numpy as np
import torch
from ember.kernels.hashed_init import HashedInit
from ember.kernels.optim import RowOptimizer


@dataclasses.dataclass
class RowBatch:
    """A batch of rows as stored: weights [n, dim], state [n, width], versions [n]."""

    weights: torch.Tensor
    state: torch.Tensor
    versions: torch.Tensor

    def select(self, mask: np.ndarray) -> RowBatch:
        """The rows where the bool ``mask`` is true (a copy)."""
        index = torch.from_numpy(np.flatnonzero(mask))
        return RowBatch(self.weights[index], self.state[index], self.versions[index])

    def fill(self, mask: np.ndarray, rows: RowBatch) -> None:
        """Overwrite, in place, the rows where the bool ``mask`` is true with ``rows`` in order."""
        index = torch.from_numpy(np.flatnonzero(mask))
        self.weights[index], self.state[index], self.versions[index] = (
            rows.weights, rows.state, rows.versions,
        )  # fmt: skip


def empty_batch(rows: int, dim: int, state_width: int) -> RowBatch:
    """``rows`` zero rows (what a fetch reports for ids it does not hold)."""
    return RowBatch(
        weights=torch.zeros(rows, dim, dtype=torch.float32),
        state=torch.zeros(rows, state_width, dtype=torch.float32),
        versions=torch.zeros(rows, dtype=torch.int64),
    )


RowFactory = Callable[[np.ndarray], RowBatch]
"""Makes the initial rows of distinct ids that a store does not hold yet."""


@dataclasses.dataclass(frozen=True)
class InitialRows:
    """A :data:`RowFactory`: rows as first written, ``weights(ids)`` with zero state and
    version 0. ``hashed``, where the native ops can make the same weights themselves,
    lets the memory store create and step a push's rows in one pass."""

    weights: Callable[[np.ndarray], torch.Tensor]
    state_width: int
    hashed: HashedInit | None = None

    def __call__(self, ids: np.ndarray) -> RowBatch:
        return RowBatch(
            weights=self.weights(ids),
            state=torch.zeros(len(ids), self.state_width, dtype=torch.float32),
            versions=torch.zeros(len(ids), dtype=torch.int64),
        )


DUMP_CHUNK_ROWS = 65_536


class RowStore(Protocol):
    """The verbs every backend implements (ids are int64 numpy arrays).

    Each call is all-or-nothing: it raises before changing anything, or applies
    the whole batch. A backend that loses its storage mid-call raises
    :class:`ember.ps_server.errors.StoreUnavailableError`.
    """

    dim: int
    state_width: int

    def fetch(self, ids: np.ndarray, with_state: bool = True) -> tuple[np.ndarray, RowBatch]:
        """``(found mask, rows)`` for ids (duplicates allowed); absent entries are unspecified
        (zeros, or whatever row a backend read for them). The batch is the caller's: fresh
        tensors, never views of the store's own."""

    def fetch_weights(self, ids: np.ndarray, out: torch.Tensor) -> np.ndarray:
        """Write the weights of held ``ids`` (duplicates allowed) into ``out`` [len(ids), dim];
        returns the ascending positions of absent ids, whose rows of ``out`` are untouched."""

    def fetch_versions(self, ids: np.ndarray) -> tuple[np.ndarray, torch.Tensor]:
        """``(found mask, versions)``, 0 where absent."""

    def fetch_state(self, ids: np.ndarray, state: torch.Tensor) -> torch.Tensor:
        """The versions [n] int64 of ``ids`` (duplicates allowed), their optimizer state
        written into ``state`` [n, state_width] float32, without reading their weights; 0
        and zero state where absent."""

    def absent(self, ids: np.ndarray) -> np.ndarray:
        """A bool mask over ids: true where no row is held."""

    def insert(self, ids: np.ndarray, rows: RowBatch) -> None:
        """Write the rows of distinct ids (upsert)."""

    def update(
        self,
        ids: np.ndarray,
        grads: torch.Tensor,
        optimizer: RowOptimizer,
        create: RowFactory | None = None,
    ) -> None:
        """One optimizer step on the rows of distinct ids; versions go up by one.

        Absent rows are first made by ``create``; without it an absent id
        raises KeyError and nothing changes.
        """

    def evict(self, ids: np.ndarray) -> None:
        """Drop the rows of distinct ids (absent ids are ignored)."""

    def dump(self, chunk_rows: int = DUMP_CHUNK_ROWS) -> Iterator[tuple[np.ndarray, RowBatch]]:
        """Every row held, as ``(ids, rows)`` chunks of at most ``chunk_rows`` rows."""

    def clear(self) -> None:
        """Drop every row."""

    def flush(self) -> None:
        """Write rows held in front of the backing store (tiered: dirty hot rows) through to it."""

    def reserve(self, rows: int) -> None:
        """Make room for ``rows`` rows in all before they arrive (a restore: memory sizes
        its index and arrays once; the others need nothing)."""

    def footprint(self) -> tuple[int, int]:
        """``(rows, bytes)`` held, in one pass (for stats: O(rows) for Redis, a key scan).

        Unlike the other verbs, safe to call while another thread runs one (stats do not
        take the table's lock); the figures may then be a moment apart.
        """

    def size(self) -> int:
        """Number of rows held."""


def weights_via_fetch(store: RowStore, ids: np.ndarray, out: torch.Tensor) -> np.ndarray:
    """``fetch_weights`` for a store whose reads go through ``fetch``."""
    found, rows = store.fetch(ids, with_state=False)
    out[torch.from_numpy(found)] = rows.weights[torch.from_numpy(found)]
    return np.flatnonzero(~found)
