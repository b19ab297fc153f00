"""Several tables' ids laid end to end and routed to their shards in one pass.

The step calls carry every table of a step; doing their bookkeeping per table
costs more than the data. Here every table's ids are joined, tables of one
row width next to each other, and routed once: a shard's part of every table
is a slice of its arrays, and the rows of one width travel as one block.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from ember.ps_server.routing import route_joined
from ember.ps_server.wire.row_dtype import RowDtype


class Width:
    """Tables ``first .. end-1`` (in the joined order), all of row width ``dim``, whose ids
    sit at joined positions ``start .. start+count-1``."""

    def __init__(self, first: int, end: int, dim: int, start: int, count: int) -> None:
        self.first, self.end, self.dim, self.start, self.count = first, end, dim, start, count


class JoinedIds:
    """Tables' ids joined width by width and routed.

    Args:
        tables: table names (distinct).
        arrays: ``arrays[t]``, the validated int64 ids of ``tables[t]``.
        dims: each table's row width.
        dtypes: how each table's rows travel.
        num_shards: shards in the cluster.

    Attributes:
        order: the tables in the caller's order.
        tables, dims, dtypes: per table, in the joined order.
        lengths, starts: how many ids each table has, and where they start among the
            joined ids.
        row_bytes: the bytes of one of each table's rows as they travel.
        shards: per shard, its ids (see :class:`ember.ps_server.routing.ShardIds`).
        widths: the runs of tables of one row width, in the joined order.
    """

    def __init__(
        self,
        tables: Sequence[str],
        arrays: Sequence[np.ndarray],
        dims: Sequence[int],
        dtypes: Sequence[RowDtype],
        num_shards: int,
    ) -> None:
        if not len(tables) == len(arrays) == len(dims) == len(dtypes):
            raise ValueError("tables, arrays, dims and dtypes must have one entry per table")
        self.order = list(tables)  # the caller's
        # Width by width, and float32 first within a width: a 2-byte dtype's odd-sized rows
        # then push no float32 rows of their width off 4-byte alignment in a joined payload.
        order = sorted(range(len(tables)), key=lambda t: (dims[t], -dtypes[t].itemsize))
        self.tables = [tables[t] for t in order]
        self.dims = [dims[t] for t in order]
        self.dtypes = [dtypes[t] for t in order]
        self.lengths = np.array([len(arrays[t]) for t in order], dtype=np.int64)
        ends = np.cumsum(self.lengths)
        self.starts = ends - self.lengths
        joined = np.concatenate([arrays[t] for t in order]) if order else np.empty(0, np.int64)
        self.shards = route_joined(self.tables, joined, ends, num_shards)
        self.widths: list[Width] = []
        first = 0
        for t in range(1, len(order) + 1):
            if t == len(order) or self.dims[t] != self.dims[first]:
                start = int(self.starts[first])
                self.widths.append(
                    Width(first, t, self.dims[first], start, int(ends[t - 1]) - start)
                )
                first = t
        self.row_bytes = np.array(
            [dim * dtype.itemsize for dim, dtype in zip(self.dims, self.dtypes)], dtype=np.int64
        )

    def parts(self, shard: int) -> list[tuple[int, int, int]]:
        """``(table, lo, hi)`` of each table with ids on ``shard``: its ids are
        ``shards[shard].ids[lo:hi]``, in the joined order."""
        bounds = self.shards[shard].bounds.tolist()
        return [(t, lo, hi) for t, (lo, hi) in enumerate(itertools.pairwise(bounds)) if hi > lo]

    def block_dtype(self, shard: int, width: Width) -> RowDtype | None:
        """The one dtype all of ``width``'s tables with ids on ``shard`` travel in (their
        rows then pack and unpack as one block), or None where they differ or have none."""
        bounds = self.shards[shard].bounds
        dtypes = {
            self.dtypes[t] for t in range(width.first, width.end) if bounds[t + 1] > bounds[t]
        }
        return dtypes.pop() if len(dtypes) == 1 else None

    def entries(self, shard: int) -> list[tuple[str, np.ndarray, RowDtype]]:
        """``(table, ids, dtype)`` of each table with ids on ``shard``, in the joined order."""
        ids = self.shards[shard].ids
        return [(self.tables[t], ids[lo:hi], self.dtypes[t]) for t, lo, hi in self.parts(shard)]
