"""Where a step lookup's rows land: one scatter per shard and row width.

A shard answers the rows of its part of a :class:`JoinedIds` back to back in
one payload (``LookupRequest.joined_rows``), so the rows of each width come as
one block, scattered into that width's output in one native pass. Each
table's rows are a slice of its width's output.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from ember.kernels.rows import scatter_rows
from ember.ps_server.client.joined_ids import JoinedIds, Width
from ember.ps_server.errors import InvalidArgumentError
from ember.ps_server.wire.messages import readonly_tensor
from ember.ps_server.wire.row_dtype import RowDtype
from ember.ps_server.wire.row_packing import rows_from_wire


class JoinedLookup:
    """One step lookup's rows, for the routing of its ids (which may repeat).

    Args:
        ids: every table's ids, joined and routed.
    """

    def __init__(self, ids: JoinedIds) -> None:
        self.ids = ids
        self._outs = [torch.empty(w.count, w.dim, dtype=torch.float32) for w in ids.widths]
        self._rows = {}
        for width, out in zip(ids.widths, self._outs):
            for t in range(width.first, width.end):
                begin = int(ids.starts[t]) - width.start
                self._rows[ids.tables[t]] = out[begin : begin + int(ids.lengths[t])]

    def place(self, shard: int, rows: memoryview) -> None:
        """Scatter ``shard``'s answer (its rows back to back, as ``ids.entries`` asked).

        Raises:
            InvalidArgumentError: ``rows`` is not as many bytes as asked for (nothing placed).
        """
        ids, part = self.ids, self.ids.shards[shard]
        entry_bytes = np.diff(part.bounds) * ids.row_bytes
        expected = int(entry_bytes.sum())
        if len(rows) != expected:
            raise InvalidArgumentError(
                f"a lookup's answer must hold {expected} bytes of rows "
                f"({part.bounds[-1]} ids), got {len(rows)}"
            )
        offset = 0
        for width, out in zip(ids.widths, self._outs):
            lo, hi = int(part.bounds[width.first]), int(part.bounds[width.end])
            size = int(entry_bytes[width.first : width.end].sum())
            if hi > lo:
                values = self._float_rows(shard, width, part.bounds, rows[offset : offset + size])
                index = torch.from_numpy(part.positions[lo:hi] - width.start)
                scatter_rows(out, index, values)
            offset += size

    def place_values(self, shard: int, values: Sequence[memoryview]) -> None:
        """Scatter ``shard``'s answer as a shard that predates joined rows gives it: each
        table's rows in its own entry, as ``ids.entries`` asked.

        Raises:
            InvalidArgumentError: another number of entries, or an entry of the wrong size
                (nothing placed).
        """
        ids, parts, part = self.ids, self.ids.parts(shard), self.ids.shards[shard]
        if len(values) != len(parts):
            raise InvalidArgumentError(
                f"a lookup's answer must hold {len(parts)} tables' rows, got {len(values)}"
            )
        blocks = [
            rows_from_wire(value, ids.dtypes[t], hi - lo, ids.dims[t],
                           f"lookup of table {ids.tables[t]!r}")
            for (t, lo, hi), value in zip(parts, values)
        ]  # fmt: skip
        width_of = {
            t: w for w, width in enumerate(ids.widths) for t in range(width.first, width.end)
        }
        for (t, lo, hi), block in zip(parts, blocks):
            w = width_of[t]
            index = torch.from_numpy(part.positions[lo:hi] - ids.widths[w].start)
            scatter_rows(self._outs[w], index, torch.from_numpy(np.array(block)))  # a copy: rare

    def rows(self) -> dict[str, torch.Tensor]:
        """Each table's rows [len(ids), dim], in the caller's order; every row is written once
        each shard's answer is placed. The tables of one row width are slices of one tensor:
        changing a table's rows in place is safe, resizing them is not."""
        return {table: self._rows[table] for table in self.ids.order}

    def _float_rows(
        self, shard: int, width: Width, bounds: np.ndarray, block: memoryview
    ) -> torch.Tensor:
        """The float32 rows of ``width``'s tables in ``block`` (a view when all are float32,
        unpacked in one call when all travel in one packed dtype)."""
        tables = range(width.first, width.end)
        ids = self.ids
        dtype = ids.block_dtype(shard, width)
        if dtype is RowDtype.FLOAT32:
            return readonly_tensor(block, torch.float32).view(-1, width.dim)
        if dtype is not None:  # one packed dtype: the block unpacked at once
            count = int(bounds[width.end] - bounds[width.first])  # place() checked its size
            what = f"the rows of width {width.dim} of a lookup"
            return torch.from_numpy(rows_from_wire(block, dtype, count, width.dim, what))
        parts, offset = [], 0
        for t in tables:
            count = int(bounds[t + 1] - bounds[t])
            size = count * int(ids.row_bytes[t])
            what = f"lookup of table {ids.tables[t]!r}"
            parts.append(rows_from_wire(block[offset : offset + size], ids.dtypes[t], count,
                                        width.dim, what))  # fmt: skip
            offset += size
        return torch.from_numpy(np.concatenate(parts))
