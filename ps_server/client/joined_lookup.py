"""Where a step lookup's rows land: one pass to route, one scatter per shard and row width.

Every table's ids are laid end to end, tables of one row width next to each
other, and routed to their shards in one pass. A shard answers its rows back
to back in one payload (``LookupRequest.joined_rows``) in that order, so the
rows of each width come as one block, scattered into that width's output in
one native pass. Each table's rows are a slice of its width's output.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from ember.kernels.rows import scatter_rows
from ember.ps_server.errors import InvalidArgumentError
from ember.ps_server.routing import route_joined
from ember.ps_server.wire.messages import readonly_tensor
from ember.ps_server.wire.row_dtype import RowDtype
from ember.ps_server.wire.row_packing import rows_from_wire


class _Width:
    """Tables ``first .. end-1`` (in the joined order), all of row width ``dim``, whose ids
    sit at joined positions ``start ..``; their rows land in ``out``."""

    def __init__(self, first: int, end: int, dim: int, start: int, rows: int) -> None:
        self.first, self.end, self.dim, self.start = first, end, dim, start
        self.out = torch.empty(rows, dim, dtype=torch.float32)


class JoinedLookup:
    """One step lookup's routing and its rows.

    Args:
        tables: table names (distinct).
        arrays: ``arrays[t]``, the validated int64 ids of ``tables[t]`` (duplicates allowed).
        dims: each table's row width.
        dtypes: how each table's rows travel.
        num_shards: shards in the cluster.
    """

    def __init__(
        self,
        tables: Sequence[str],
        arrays: Sequence[np.ndarray],
        dims: Sequence[int],
        dtypes: Sequence[RowDtype],
        num_shards: int,
    ) -> None:
        order = sorted(range(len(tables)), key=lambda t: dims[t])  # stable: width by width
        self._tables = [tables[t] for t in order]
        self._dims = [dims[t] for t in order]
        self._dtypes = [dtypes[t] for t in order]
        self._row_bytes = np.array(
            [dim * dtype.itemsize for dim, dtype in zip(self._dims, self._dtypes)], dtype=np.int64
        )
        lengths = np.array([len(arrays[t]) for t in order], dtype=np.int64)
        ends = np.cumsum(lengths)
        joined = np.concatenate([arrays[t] for t in order]) if order else np.empty(0, np.int64)
        self.shards = route_joined(self._tables, joined, ends, num_shards)
        self._widths: list[_Width] = []
        first = 0
        for t in range(1, len(order) + 1):
            if t == len(order) or self._dims[t] != self._dims[first]:
                start = int(ends[first] - lengths[first])
                self._widths.append(
                    _Width(first, t, self._dims[first], start, int(ends[t - 1]) - start)
                )
                first = t
        self._rows = {}
        for width in self._widths:
            for t in range(width.first, width.end):
                begin = int(ends[t] - lengths[t]) - width.start
                self._rows[self._tables[t]] = width.out[begin : begin + int(lengths[t])]
        self._order = list(tables)

    def entries(self, shard: int) -> list[tuple[str, np.ndarray, RowDtype]]:
        """``(table, ids, dtype)`` of each table with ids on ``shard``, in reply order."""
        bounds = self.shards[shard].bounds.tolist()
        ids = self.shards[shard].ids
        return [
            (table, ids[lo:hi], dtype)
            for table, dtype, lo, hi in zip(self._tables, self._dtypes, bounds, bounds[1:])
            if hi > lo
        ]

    def place(self, shard: int, rows: memoryview) -> None:
        """Scatter ``shard``'s answer (its rows back to back, as :meth:`entries` asked).

        Raises:
            InvalidArgumentError: ``rows`` is not as many bytes as asked for (nothing placed).
        """
        part = self.shards[shard]
        entry_bytes = np.diff(part.bounds) * self._row_bytes
        expected = int(entry_bytes.sum())
        if len(rows) != expected:
            raise InvalidArgumentError(
                f"a lookup's answer must hold {expected} bytes of rows "
                f"({part.bounds[-1]} ids), got {len(rows)}"
            )
        offset = 0
        for width in self._widths:
            lo, hi = int(part.bounds[width.first]), int(part.bounds[width.end])
            size = int(entry_bytes[width.first : width.end].sum())
            if hi > lo:
                values = self._float_rows(width, part.bounds, rows[offset : offset + size])
                index = torch.from_numpy(part.positions[lo:hi] - width.start)
                scatter_rows(width.out, index, values)
            offset += size

    def rows(self) -> dict[str, torch.Tensor]:
        """Each table's rows [len(ids), dim], in the caller's order (slices of one tensor per
        row width; every row is written once each shard's answer is placed)."""
        return {table: self._rows[table] for table in self._order}

    def _float_rows(self, width: _Width, bounds: np.ndarray, block: memoryview) -> torch.Tensor:
        """The float32 rows of ``width``'s tables in ``block`` (a view when all are float32)."""
        tables = range(width.first, width.end)
        if all(self._dtypes[t] is RowDtype.FLOAT32 for t in tables):
            return readonly_tensor(block, torch.float32).view(-1, width.dim)
        parts, offset = [], 0
        for t in tables:
            count = int(bounds[t + 1] - bounds[t])
            size = count * int(self._row_bytes[t])
            what = f"lookup of table {self._tables[t]!r}"
            piece = block[offset : offset + size]
            parts.append(rows_from_wire(piece, self._dtypes[t], count, width.dim, what))
            offset += size
        return torch.from_numpy(np.concatenate(parts))
