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
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch
from ember.kernels.hashed_init import ZEROS, initial_rows_at
from ember.ps_server.id_arrays import id_tensor
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


def weight_bytes(table: Table, rows: int) -> int:
    """The bytes of ``rows`` float32 rows of ``table`` in :func:`read_tables`' answer."""
    return rows * ROW_DTYPE.itemsize * table.spec.dim


def state_answer_bytes(table: Table, rows: int) -> int:
    """The bytes of ``rows`` rows' versions and optimizer state of ``table`` in
    :func:`read_table_states`' answer."""
    return rows * (VERSION_DTYPE.itemsize + ROW_DTYPE.itemsize * table.store.state_width)


def read_tables(reads: Sequence[tuple[Table, np.ndarray]], out: torch.Tensor) -> None:
    """:meth:`Table.read_weights` of every ``(table, ids)`` into the flat uint8 ``out`` (of
    their :func:`weight_bytes`): their rows as float32 back to back, at any alignment. The
    tables whose rows live in memory are read in one native pass
    (:func:`fetch_weights_joined`) under :func:`_locked_together`, and the initial rows of
    their absent ids made after the locks are released (one native call; normal
    initializers in Python); every other table is read alone. A read of no ids reads
    nothing and is not counted.

    Raises:
        ValueError: ``out`` is not the size of the answer (nothing written).
    """
    sizes = [weight_bytes(table, len(ids)) for table, ids in reads]
    offsets = _starts(out, sizes)
    native, separate = _by_path(reads)
    if native:
        keys = {k: id_tensor(reads[k][1]) for k in native}  # copies only read-only ids
        with _locked_together(reads[k][0] for k in native):
            absent = fetch_weights_joined(
                [(reads[k][0].store, keys[k], offsets[k]) for k in native], out
            )
            for k in native:
                reads[k][0]._count_read(len(reads[k][1]))
        made, in_python = [], []
        for k, positions in zip(native, absent):
            if len(positions):
                hashed = reads[k][0]._initial_rows.hashed
                (in_python if hashed is None else made).append((k, positions, hashed))
        if made:
            initial_rows_at(
                [keys[k] for k, _, _ in made], [positions for _, positions, _ in made],
                [offsets[k] for k, _, _ in made],
                [weight_bytes(reads[k][0], 1) for k, _, _ in made],
                [hashed for _, _, hashed in made], out,
            )  # fmt: skip
        for k, positions, _ in in_python:
            table, ids = reads[k]
            rows = out[offsets[k] : offsets[k] + sizes[k]].view(len(ids), -1)
            made_rows = _host_bytes(initial_rows(table.spec, ids[positions.numpy()]))
            rows[positions] = made_rows.view(len(positions), -1)
    for k in separate:
        rows = reads[k][0].read_weights(reads[k][1])
        out[offsets[k] : offsets[k] + sizes[k]] = _host_bytes(rows)


def read_table_states(reads: Sequence[tuple[Table, np.ndarray]], out: torch.Tensor) -> None:
    """:meth:`Table.read_state` of every ``(table, ids)`` into the flat uint8 ``out`` (of
    their :func:`state_answer_bytes`): per read, its rows' versions (int64), then their
    optimizer state (float32, the table's state width per row), reads back to back at any
    alignment; 0 and zero state where never written. Tables in memory are read in one
    native pass (:func:`fetch_state_joined`) under :func:`_locked_together` (absent rows
    zeroed after the locks are released); every other table alone.

    Raises:
        ValueError: ``out`` is not the size of the answer (nothing written).
    """
    sizes = [state_answer_bytes(table, len(ids)) for table, ids in reads]
    offsets = _starts(out, sizes)
    state_at = [
        start + VERSION_DTYPE.itemsize * len(ids) for start, (_, ids) in zip(offsets, reads)
    ]
    native, separate = _by_path(reads)
    if native:
        keys = {k: id_tensor(reads[k][1]) for k in native}  # copies only read-only ids
        with _locked_together(reads[k][0] for k in native):
            absent = fetch_state_joined(
                [(reads[k][0].store, keys[k], offsets[k], state_at[k]) for k in native], out
            )
        parts = []  # (read, absent positions, start, bytes per row): versions, then state
        for k, positions in zip(native, absent):
            if len(positions):
                state_row_bytes = (offsets[k] + sizes[k] - state_at[k]) // len(reads[k][1])
                parts.append((k, positions, offsets[k], VERSION_DTYPE.itemsize))
                if state_row_bytes:  # SGD keeps no state
                    parts.append((k, positions, state_at[k], state_row_bytes))
        if parts:
            initial_rows_at(
                [keys[k] for k, _, _, _ in parts], [p for _, p, _, _ in parts],
                [start for _, _, start, _ in parts], [size for _, _, _, size in parts],
                [ZEROS] * len(parts), out,
            )  # fmt: skip
    for k in separate:
        table, ids = reads[k]
        state = torch.empty(len(ids), table.store.state_width, dtype=torch.float32)
        versions = table.read_state(ids, state)
        out[offsets[k] : state_at[k]] = _host_bytes(versions)
        out[state_at[k] : offsets[k] + sizes[k]] = _host_bytes(state)


def _by_path(reads: Sequence[tuple[Table, np.ndarray]]) -> tuple[list[int], list[int]]:
    """The positions of the reads with ids that join a native pass, and of the others."""
    native, separate = [], []
    for k, (table, ids) in enumerate(reads):
        if len(ids):
            (native if table._reads_natively() else separate).append(k)
    return native, separate


def _starts(out: torch.Tensor, sizes: Sequence[int]) -> list[int]:
    """Where each of ``sizes`` starts when they are laid back to back in ``out``.

    Raises:
        ValueError: ``out`` is not a flat uint8 tensor of their sum.
    """
    ends = list(itertools.accumulate(sizes))
    total = ends[-1] if ends else 0
    if out.dtype != torch.uint8 or out.dim() != 1 or len(out) != total:
        raise ValueError(
            f"out must be a flat uint8 tensor of the answer's {total} bytes, got "
            f"{out.dtype} of shape {tuple(out.shape)}"
        )
    return [0, *ends][: len(sizes)]


def _host_bytes(values: torch.Tensor) -> torch.Tensor:
    """The bytes of ``values``, flat, in host order: the wire's little-endian order (see
    :func:`~ember.ps_server.wire.messages.require_little_endian_host`)."""
    return values.contiguous().view(-1).view(torch.uint8)


@contextlib.contextmanager
def _locked_together(tables: Iterable[Table]) -> Iterator[None]:
    """Hold the locks of ``tables`` (each once) together, taken in the order of their names
    (then identities): every pass over several tables takes them so, and two such passes
    never deadlock."""
    distinct = {id(table): table for table in tables}
    with contextlib.ExitStack() as locks:
        for key in sorted(distinct, key=lambda key: (distinct[key].spec.name, key)):
            locks.enter_context(distinct[key]._lock)
        yield
