"""Passes over several tables of one shard at once: a step's pushes stepped, its rows and
its rows' optimizer state read, each in one native pass over the tables whose rows live
in memory (one call instead of one per table), every other table alone.

The companion of :class:`~ember.ps_server.shard.table.Table`: a pass holds the tables'
locks together (:func:`_locked_together`, in name order, so two passes never deadlock)
and does, per table, what the table's own methods do under its lock.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch
from ember.ps_server.shard.initializers import initial_rows
from ember.ps_server.shard.table import Table
from ember.ps_server.stores.memory import (
    fetch_state_joined,
    fetch_weights_joined,
    update_stores,
)
from ember.ps_server.wire.messages import ROW_DTYPE, VERSION_DTYPE


def push_tables(pushes: Sequence[tuple[Table, np.ndarray, torch.Tensor]], request_id: str) -> None:
    """:meth:`Table.push` (``distinct``) of every ``(table, distinct ids, summed grads)``
    under one request id. The tables whose rows live in memory and are made natively are
    stepped in one native pass (:func:`update_stores`, all or none of them), their locks
    held together, taken in name order (so two such calls never deadlock); every other
    table is pushed alone after it. Each table remembers the request id as soon as it is
    written, so a retry after a failure applies each table once.

    Raises:
        ValueError: a table given twice.
    """
    names = [table.spec.name for table, _, _ in pushes]
    if len(set(names)) != len(names):
        raise ValueError("push_tables was given one table twice")
    native, separate = [], []
    for push in pushes:
        (native if push[0]._steps_natively() else separate).append(push)
    with _locked_together(table for table, _, _ in native):
        fresh = [push for push in native if not push[0]._counted_duplicate(request_id)]
        update_stores(
            [(t.store, ids, grads, t.spec.optimizer, t._initial_rows.hashed)
             for t, ids, grads in fresh]
        )  # fmt: skip
        for table, ids, _ in fresh:
            table._pushed(len(ids), ids, request_id)
    for table, ids, grads in separate:
        table.push(ids, grads, request_id, distinct=True)


def read_tables(reads: Sequence[tuple[Table, np.ndarray]], out: torch.Tensor) -> None:
    """:meth:`Table.read_weights` of every ``(table, ids)`` into the flat uint8 ``out``:
    their rows as the wire's float32 back to back, at any alignment. The tables whose rows
    live in memory are read in one native pass (:func:`fetch_weights_joined`) under
    :func:`_locked_together`, with the initial rows of absent ids where the native ops make
    them (uniform and zeros initializers; others made afterwards, outside the locks);
    every other table is read alone."""
    sizes = [len(ids) * ROW_DTYPE.itemsize * table.spec.dim for table, ids in reads]
    native, offsets = _native_reads(reads), _starts(sizes)
    initial = [reads[k][0]._initial_rows.hashed for k in native]
    with _locked_together(reads[k][0] for k in native):
        absent = fetch_weights_joined(
            [(reads[k][0].store, reads[k][1], offsets[k]) for k in native], initial, out
        )
        for k in native:
            reads[k][0]._count_read(len(reads[k][1]))
    for k, positions, made in zip(native, absent, initial):
        if len(positions) and made is None:
            table, ids = reads[k]
            rows = out[offsets[k] : offsets[k] + sizes[k]].view(len(ids), -1)
            rows[positions] = _wire_bytes(initial_rows(table.spec, ids[positions]), ROW_DTYPE)
    for k in _others(reads, native):
        rows = reads[k][0].read_weights(reads[k][1])
        out[offsets[k] : offsets[k] + sizes[k]] = _wire_bytes(rows, ROW_DTYPE).view(-1)


def read_table_states(reads: Sequence[tuple[Table, np.ndarray]], out: torch.Tensor) -> None:
    """:meth:`Table.read_state` of every ``(table, ids)`` into the flat uint8 ``out``: per
    read, its rows' versions (the wire's int64), then their optimizer state (its float32,
    the table's state width per row), reads back to back at any alignment; 0 and zero
    state where never written. Tables in memory are read in one native pass
    (:func:`fetch_state_joined`) under :func:`_locked_together`; every other table alone."""
    sizes = [
        len(ids) * (VERSION_DTYPE.itemsize + ROW_DTYPE.itemsize * table.store.state_width)
        for table, ids in reads
    ]
    native, offsets = _native_reads(reads), _starts(sizes)
    with _locked_together(reads[k][0] for k in native):
        fetch_state_joined([(reads[k][0].store, reads[k][1], offsets[k]) for k in native], out)
    for k in _others(reads, native):
        table, ids = reads[k]
        state = torch.empty(len(ids), table.store.state_width, dtype=torch.float32)
        versions = table.read_state(ids, state)
        state_at = offsets[k] + VERSION_DTYPE.itemsize * len(ids)
        out[offsets[k] : state_at] = _wire_bytes(versions, VERSION_DTYPE).view(-1)
        out[state_at : offsets[k] + sizes[k]] = _wire_bytes(state, ROW_DTYPE).view(-1)


# The native passes copy host-order bytes: the wire's little-endian ones only where the
# host is little-endian (elsewhere every table is read alone and converted).
_NATIVE_IS_WIRE = sys.byteorder == "little"


def _native_reads(reads: Sequence[tuple[Table, np.ndarray]]) -> list[int]:
    """The positions of the reads that join a native pass."""
    if not _NATIVE_IS_WIRE:
        return []
    return [k for k, (table, _) in enumerate(reads) if table._reads_natively()]


def _others(reads: Sequence[tuple[Table, np.ndarray]], native: list[int]) -> list[int]:
    """The positions of the reads that do not join the native pass, ascending."""
    joined = set(native)
    return [k for k in range(len(reads)) if k not in joined]


def _starts(sizes: Sequence[int]) -> list[int]:
    """Where each of ``sizes`` starts when they are laid back to back from 0."""
    return [0, *itertools.accumulate(sizes)][: len(sizes)]


def _wire_bytes(values: torch.Tensor, dtype: np.dtype) -> torch.Tensor:
    """``values`` [n, ...] as the bytes ``dtype`` (a wire dtype) lays them out, [n, row bytes]."""
    array = np.ascontiguousarray(values.numpy(), dtype)
    return torch.from_numpy(array.view(np.uint8).reshape(len(array), -1))


@contextlib.contextmanager
def _locked_together(tables: Iterable[Table]) -> Iterator[None]:
    """Hold the locks of ``tables`` (each once) together, taken in name order: every pass
    over several tables takes them so, and two such passes never deadlock."""
    distinct = {id(table): table for table in tables}
    with contextlib.ExitStack() as locks:
        for table in sorted(distinct.values(), key=lambda table: table.spec.name):
            locks.enter_context(table._lock)
        yield
