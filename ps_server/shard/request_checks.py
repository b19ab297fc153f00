"""What a shard checks before it reads or writes: the table, the ids, the reply's size and
which ids it owns. Nothing is read or applied until every part of a request passes."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
from ember.ps_server.errors import (
    InvalidArgumentError,
    MessageTooLargeError,
    NotOwnedError,
    TableNotFoundError,
)
from ember.ps_server.routing import shard_of_tables
from ember.ps_server.wire.messages import ROW_BYTES_PER_ELEMENT, id_view
from ember.ps_server.wire.row_dtype import RowDtype
from ember.ps_server.wire.row_packing import rows_from_wire

if TYPE_CHECKING:
    from ember.ps_server.shard.table import Table

# Room for the reply's field tags and lengths next to its packed payload.
REPLY_OVERHEAD_BYTES = 1024
# A request id is remembered (a table keeps its dedup window of them) and goes into the
# write-ahead log and checkpoints. PSClient's (a uuid, a sequence number and, per table of
# a batch, the table's name of at most 128 characters) stay under 200.
MAX_REQUEST_ID_CHARS = 256
# Joins a job's name and clock in the ids the step plane dedups its writes by; never in a
# push's or an assign's request id.
STEP_ID_MARK = "@"

Bytes = bytes | memoryview
# Table names a not-found error lists (128 characters at most each): the error fits in gRPC's
# 8 KiB of trailing metadata however many tables a shard holds.
_NAMES_LISTED = 10


def check_request_id(request_id: str, what: str) -> None:
    """Refuse a ``what`` (push, assign) whose request id is empty, longer than
    :data:`MAX_REQUEST_ID_CHARS`, not printable, or holds ``@``: the step plane's updates
    share a table's dedup window under ids ``job@clock``, so a push may not take one (it
    would make that clock's update look applied, and be dropped). Checked where requests
    arrive, not at replay: a log written before these rules must still replay.

    Raises:
        InvalidArgumentError: naming the rule.
    """
    if (
        not 0 < len(request_id) <= MAX_REQUEST_ID_CHARS
        or not request_id.isprintable()
        or STEP_ID_MARK in request_id
    ):
        raise InvalidArgumentError(
            f"{what} needs a request_id of 1..{MAX_REQUEST_ID_CHARS} printable characters "
            f"without {STEP_ID_MARK!r} (reserved for step clocks) for retry deduplication, "
            f"got {len(request_id)} starting {request_id[:40]!r}"
        )


def step_request_id(job: str, clock: int, rank: int | None) -> str:
    """The request id a step write of ``job``'s ``clock`` is deduplicated by in a table's
    window (``rank``: an ASYNC job's rank, whose clocks apply one by one)."""
    return f"{job}{STEP_ID_MARK}{clock}" + (f"#{rank}" if rank is not None else "")


def weights_only(table: Table) -> int:
    """The 4-byte words of a row a lookup or an update's read answers: its weights."""
    return table.spec.dim


def weights_and_int64(table: Table) -> int:
    """The 4-byte words of a pulled row (its weights and version) or a refreshed one (its
    weights and position)."""
    return table.spec.dim + 2


def version_and_state(table: Table) -> int:
    """The 4-byte words of a row's optimizer-state read: an int64 version and its state."""
    return 2 + table.store.state_width


class RequestChecks:
    """The checks of shard ``shard`` of ``num_shards`` over ``tables`` (the live registry).

    Args:
        tables: the shard's tables by name (read, never changed, here).
        shard: this shard's index.
        num_shards: shards in the cluster.
        max_message_bytes: the largest reply the shard sends.
    """

    def __init__(
        self, tables: Mapping[str, Table], shard: int, num_shards: int, max_message_bytes: int
    ) -> None:
        self._tables = tables
        self.shard, self.num_shards = shard, num_shards
        self.max_message_bytes = max_message_bytes

    def table(self, name: str) -> Table:
        """The table called ``name``.

        Raises:
            TableNotFoundError: there is none, naming those there are.
        """
        table = self._tables.get(name)
        if table is None:
            names = sorted(self._tables)
            known = ", ".join(names[:_NAMES_LISTED]) or "none"
            if len(names) > _NAMES_LISTED:  # the message must fit gRPC's metadata limit
                known += f" and {len(names) - _NAMES_LISTED} more"
            raise TableNotFoundError(
                f"table {name[:256]!r} does not exist (tables: {known}); create it first"
            )
        return table

    def reads(
        self,
        entries: Sequence[tuple[str, Bytes]],
        row_words: Callable[[Table], int] = weights_and_int64,
    ) -> list[tuple[Table, np.ndarray]]:
        """The table and ids of each read ``(table, packed ids)``: ids (see :meth:`ids`) and
        each reply's size (``row_words(table)``: the 4-byte words a reply row of that table
        carries) checked."""
        names = [name for name, _ in entries]
        targets, ids = self._located(names, [packed for _, packed in entries])
        for name, target, id_array in zip(names, targets, ids):
            reply_bytes = (
                len(id_array) * row_words(target) * ROW_BYTES_PER_ELEMENT + REPLY_OVERHEAD_BYTES
            )
            if reply_bytes > self.max_message_bytes:
                raise MessageTooLargeError(
                    f"a read of {len(id_array)} ids from table {name!r} needs up to a "
                    f"{reply_bytes}-byte reply, over this shard's limit of "
                    f"{self.max_message_bytes}; split the ids into smaller requests"
                )
        return list(zip(targets, ids))

    def ids(self, tables: Sequence[str], packed: Sequence[Bytes]) -> list[np.ndarray]:
        """The ids of each entry (``packed[t]``: little-endian int64 ids of ``tables[t]``, each
        an existing table), checked together (none negative, every one owned here): slices of
        one writable copy of them laid end to end, so the passes that read them copy none.

        Raises:
            InvalidArgumentError: a length that is not a multiple of 8, or a negative id
                (naming its table).
            NotOwnedError: an id another shard owns (naming its table, id and owner).
        """
        arrays = [id_view(data) for data in packed]
        ends = list(itertools.accumulate(map(len, arrays)))
        joined = np.concatenate(arrays) if arrays else np.empty(0, dtype=np.int64)
        if len(joined) and joined.min() < 0:
            first = int(np.argmax(joined < 0))
            table = tables[bisect.bisect_right(ends, first)]
            raise InvalidArgumentError(
                f"ids must be >= 0; got {int(joined[first])} in table {table!r}"
            )
        self._owned_joined(tables, joined, ends)
        return [joined[start:end] for start, end in zip([0, *ends], ends)]

    def _located(
        self, tables: Sequence[str], packed: Sequence[Bytes]
    ) -> tuple[list[Table], list[np.ndarray]]:
        """Every table of a request found, then its ids checked (see :meth:`ids`): a missing
        table is refused before any id is looked at."""
        targets = [self.table(name) for name in tables]
        return targets, self.ids(tables, packed)

    def writes(
        self, entries: Sequence[tuple[str, Bytes, Bytes, RowDtype]]
    ) -> list[tuple[Table, np.ndarray, np.ndarray]]:
        """The table, ids and float32 gradient rows (read-only) of each write ``(table, packed
        ids, packed gradients, their dtype)``: every table found, then the ids (see
        :meth:`ids`), then the rows (finite, one per id) checked.

        Raises:
            InvalidArgumentError, TableNotFoundError, NotOwnedError: as for Push.
        """
        writes = []
        targets, ids = self._located([e[0] for e in entries], [e[1] for e in entries])
        for (name, _, grads, dtype), target, id_array in zip(entries, targets, ids):
            grad_rows = rows_from_wire(grads, dtype, len(id_array), target.spec.dim, "grads")
            grad_rows.flags.writeable = False  # a view of the request's bytes when float32
            if not np.isfinite(grad_rows).all():
                bad = int(np.flatnonzero(~np.isfinite(grad_rows).all(axis=1))[0])
                raise InvalidArgumentError(
                    f"grads for table {name!r} contain NaN or Inf (first at row {bad}, id "
                    f"{int(id_array[bad])}); nothing was applied"
                )
            writes.append((target, id_array, grad_rows))
        return writes

    def replies_fit(self, parts: Sequence[tuple[Table, int, int]]) -> None:
        """Refuse replies ``(table, rows, 4-byte words per row)`` that together pass the limit
        (each part alone was checked by :meth:`reads`, with the same width; a refusal of one
        part is worded as its refusal there).

        Raises:
            MessageTooLargeError: they do.
        """
        reply_bytes = sum(
            rows * words * ROW_BYTES_PER_ELEMENT + REPLY_OVERHEAD_BYTES for _, rows, words in parts
        ) + (REPLY_OVERHEAD_BYTES if len(parts) > 1 else 0)
        if reply_bytes <= self.max_message_bytes:
            return
        ids = sum(rows for _, rows, _ in parts)
        if len(parts) == 1:
            what = f"a read of {ids} ids from table {parts[0][0].spec.name!r}"
            split = "the ids into smaller requests"
        else:
            what, split = f"a batch of {len(parts)} reads ({ids} ids)", "it into smaller batches"
        raise MessageTooLargeError(
            f"{what} needs up to a {reply_bytes}-byte reply, over this shard's limit of "
            f"{self.max_message_bytes}; split {split}"
        )

    def _owned_joined(self, tables: Sequence[str], ids: np.ndarray, ends: Sequence[int]) -> None:
        """Refuse ids this shard does not own: ``ids`` laid end to end, ``tables[t]``'s ending
        at ``ends[t]``, routed in one pass.

        Raises:
            NotOwnedError: naming the first foreign id's table, id and owner.
        """
        if self.num_shards == 1 or not len(ids):
            return
        owners = shard_of_tables(tables, ids, np.array(ends, dtype=np.int64), self.num_shards)
        foreign = np.flatnonzero(owners != self.shard)
        if not len(foreign):
            return
        first = int(foreign[0])
        t = bisect.bisect_right(ends, first)
        start = ends[t - 1] if t else 0
        count = int(np.count_nonzero(owners[start : ends[t]] != self.shard))
        raise NotOwnedError(
            f"{count} of {ends[t] - start} ids of table {tables[t]!r} belong to other shards "
            f"(id {int(ids[first])} belongs to shard {int(owners[first])}, this is shard "
            f"{self.shard} of {self.num_shards}); check the client's endpoint list"
        )
