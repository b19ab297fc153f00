"""A step request's entries, validated: the reads of a lookup or an update's refresh, read
and read_state, and an update's gradients (each table once per entry list)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from ember.ps_server.errors import InvalidArgumentError
from ember.ps_server.shard.step_rows import TableRead
from ember.ps_server.wire.row_dtype import RowDtype
from ember.ps_server.wire.step_codec import TableGradsView, TableIdsView

if TYPE_CHECKING:
    from ember.ps_server.shard.request_checks import RequestChecks
    from ember.ps_server.shard.table import Table

# A validated update of one table: the table, its ids and gradient rows.
TableUpdate = tuple["Table", np.ndarray, np.ndarray]


def checked_reads(
    checks: RequestChecks,
    entries: list[TableIdsView],
    what: str,
    row_words: Callable[[Table], int],
) -> list[TableRead]:
    """The validated reads of ``entries`` (a ``what``: lookup, refresh, read or read_state),
    each with the dtype its rows travel in, their replies' size checked at ``row_words``
    words a row (see :meth:`RequestChecks.reads`).

    Raises:
        InvalidArgumentError, TableNotFoundError, NotOwnedError, MessageTooLargeError: as
            :meth:`RequestChecks.reads` raises them, or a table named twice.
    """
    _distinct_tables(entries, what)
    dtypes = [RowDtype.from_wire(e.dtype) for e in entries]
    reads = checks.reads([(e.table, e.ids) for e in entries], row_words)
    return [(target, ids, dtype) for (target, ids), dtype in zip(reads, dtypes)]


def checked_updates(checks: RequestChecks, entries: list[TableGradsView]) -> list[TableUpdate]:
    """The validated updates of ``entries``, their float32 gradients copied out of the request
    (an exact clock's updates are buffered past the request's life; the checked ids are a
    copy already, see :meth:`RequestChecks.ids`).

    Raises:
        InvalidArgumentError, TableNotFoundError, NotOwnedError: as
            :meth:`RequestChecks.writes` raises them, or a table named twice.
    """
    _distinct_tables(entries, "update")
    writes = checks.writes(
        [(e.table, e.ids, e.grads, RowDtype.from_wire(e.dtype)) for e in entries]
    )
    return [(target, ids, grads.copy()) for target, ids, grads in writes]


def _distinct_tables(entries: list, what: str) -> None:
    names = [entry.table for entry in entries]
    if len(set(names)) != len(names):
        repeated = sorted(name for name, count in Counter(names).items() if count > 1)
        shown = ", ".join(repr(name[:128]) for name in repeated[:10])  # fits gRPC's metadata
        raise InvalidArgumentError(f"a {what} names a table more than once: {shown}")
