"""The rows a step's replies carry: a lookup's rows written into its reply, as each entry's
dtype carries them, the refresh rows an update's clock changed, and rows' optimizer state."""

from __future__ import annotations

import itertools
from typing import NamedTuple, NoReturn

import numpy as np
import torch
from ember.ps_server.errors import OutOfRangeError
from ember.ps_server.shard.table import Table
from ember.ps_server.shard.table_passes import (
    read_table_states,
    read_tables,
    state_answer_bytes,
)
from ember.ps_server.wire.proto_wire import bytes_view
from ember.ps_server.wire.row_dtype import RowDtype
from ember.ps_server.wire.row_packing import packed_at_once, rows_to_wire

# A validated read of one table: the table, its ids and the dtype its rows travel in.
TableRead = tuple[Table, np.ndarray, RowDtype]


class AppliedUpdate(NamedTuple):
    """What an applied update answers: whether its clock was applied before (a duplicate),
    per refresh entry ``(positions, rows, their dtype)``, the job's watermark, and the
    validated reads riding on it. Their rows (:func:`write_joined_rows`) and state
    (:func:`write_optimizer_state`) are read afterwards, outside the job's lock, as a lookup's
    rows are: they hold every rank's clock and, as for a lookup, may hold later clocks in
    part (no later clock of the caller's can be applied before it has this answer)."""

    duplicate: bool
    refreshed: list[tuple[np.ndarray, np.ndarray, RowDtype]]
    watermark: int
    reads: list[TableRead]
    states: list[TableRead]  # rows whose optimizer state to answer, read as ``reads`` are


def wire_row_bytes(read: TableRead) -> int:
    """The bytes of ``read``'s rows as its dtype carries them."""
    target, ids, dtype = read
    return len(ids) * target.spec.dim * dtype.itemsize


def write_wire_rows(read: TableRead, view: memoryview) -> None:
    """Write ``read``'s rows into ``view`` (:func:`wire_row_bytes` long) as its dtype carries
    them: float32 rows are gathered straight into it (:func:`read_tables`).

    Raises:
        OutOfRangeError: a row the dtype cannot hold (``view`` is partly written).
    """
    target, ids, dtype = read
    if not len(ids):
        return
    if dtype is RowDtype.FLOAT32:
        read_tables([(target, ids)], _bytes_of(view))
    else:
        rows = target.read_weights(ids)
        view[:] = bytes_view(rows_to_wire(rows, dtype, f"table {target.spec.name!r}", ids))


def write_joined_rows(reads: list[TableRead], view: memoryview) -> None:
    """Write every read's rows back to back into ``view`` (the sum of their
    :func:`wire_row_bytes`): each run of reads that travel in one dtype is read at once
    (:func:`read_tables`) and, packed, packed in one call.

    Raises:
        OutOfRangeError: a row its read's dtype cannot hold (``view`` is partly written).
    """
    offset = 0
    for dtype, run in itertools.groupby(reads, key=lambda read: read[2]):
        run = list(run)
        size = sum(wire_row_bytes(read) for read in run)
        if size:
            _write_run(run, dtype, view[offset : offset + size])
        offset += size


def _write_run(run: list[TableRead], dtype: RowDtype, view: memoryview) -> None:
    """Write the rows of reads that travel in ``dtype`` back to back into ``view``, read at
    once.

    Raises:
        OutOfRangeError: a row ``dtype`` cannot hold, named by its read's table and id
            (``view`` is then untouched).
    """
    tables = [(target, ids) for target, ids, _ in run]
    if dtype is RowDtype.FLOAT32:
        read_tables(tables, _bytes_of(view))
        return
    rows = torch.empty(len(view) // dtype.itemsize, dtype=torch.float32)
    read_tables(tables, rows.view(torch.uint8))
    packed = packed_at_once(rows, dtype)
    if packed is None:  # a row that cannot travel: the first read holding one names it
        _refuse_beyond(run, dtype, rows)
    view[:] = bytes_view(packed)


def _refuse_beyond(run: list[TableRead], dtype: RowDtype, rows: torch.Tensor) -> NoReturn:
    """Raise the refusal of the first row of ``rows`` (the run's rows back to back, read
    once) that ``dtype`` cannot hold, as its read's own packing words it.

    Raises:
        OutOfRangeError: always; packing is per value, so some read's rows refuse.
    """
    offset = 0
    for target, ids, _ in run:
        count = len(ids) * target.spec.dim
        if count:
            part = rows[offset : offset + count].view(len(ids), -1)
            rows_to_wire(part, dtype, f"table {target.spec.name!r}", ids)
        offset += count
    raise AssertionError("the run's rows were refused at once but by none of its reads")


def _positions_in(ids: np.ndarray, sorted_ids: np.ndarray | None) -> np.ndarray:
    """Positions into ``ids`` of those that are in ``sorted_ids`` (ascending int64)."""
    if sorted_ids is None or not len(sorted_ids) or not len(ids):
        return np.empty(0, dtype=np.int64)
    where = np.searchsorted(sorted_ids, ids).clip(max=len(sorted_ids) - 1)
    return np.flatnonzero(sorted_ids[where] == ids).astype(np.int64)


def refreshed_rows(
    changed: dict[str, np.ndarray] | None, refresh: list[TableRead]
) -> list[tuple[np.ndarray, np.ndarray, RowDtype]]:
    """Per refresh entry, the positions of its ids that a clock ``changed`` (its sorted ids
    per table; None: no longer remembered, so all of them), with their rows as they are now
    and the dtype they travel in: the entry's, or float32 where a row is beyond it (the
    clock is applied: its answer must not fail)."""
    replies = []
    for target, ids, dtype in refresh:
        if changed is None:
            positions = np.arange(len(ids), dtype=np.int64)
        else:
            positions = _positions_in(ids, changed.get(target.spec.name))
        changed_ids, name = ids[positions], f"table {target.spec.name!r}"
        rows = target.read_weights(changed_ids)
        try:
            replies.append((positions, rows_to_wire(rows, dtype, name, changed_ids), dtype))
        except OutOfRangeError:
            wide = RowDtype.FLOAT32
            replies.append((positions, rows_to_wire(rows, wide, name, changed_ids), wide))
    return replies


def state_bytes(reads: list[TableRead]) -> int:
    """The bytes of every read's rows' versions and optimizer state (see
    :func:`write_optimizer_state`)."""
    return sum(state_answer_bytes(target, len(ids)) for target, ids, _ in reads)


def write_optimizer_state(reads: list[TableRead], view: memoryview) -> None:
    """Write each read's rows' versions (int64), then their optimizer state (float32, the
    table's state width per row), read after one another, back to back into ``view``
    (:func:`state_bytes` long): an update's ``state`` (initial rows at version 0 with zero
    state where never written), every table at once (:func:`read_table_states`)."""
    if len(view):
        read_table_states([(target, ids) for target, ids, _ in reads], _bytes_of(view))


def _bytes_of(view: memoryview) -> torch.Tensor:
    """A uint8 tensor over the writable ``view``'s bytes."""
    return torch.frombuffer(view, dtype=torch.uint8)
