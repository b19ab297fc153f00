"""A step update's gradients: checked and joined once, packed per shard in one gather per
row width (see :class:`JoinedIds`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from ember.ps_server.client.joined_ids import JoinedIds
from ember.ps_server.errors import OutOfRangeError
from ember.ps_server.id_arrays import check_finite, grad_tensor, sum_duplicates
from ember.ps_server.wire.row_dtype import RowDtype
from ember.ps_server.wire.row_packing import rows_to_wire


class JoinedUpdate:
    """One rank's gradients of a step: each table's distinct ids with their summed rows,
    routed (``ids``) and ready to pack per shard.

    Args:
        tables: table names (distinct).
        arrays: ``arrays[t]``, the validated int64 ids of ``tables[t]`` (duplicates allowed:
            their rows are summed).
        grads: ``grads[t]``, its gradient rows [len(ids), dim] (anything ``torch.as_tensor``
            takes).
        dims, dtypes, num_shards: as :class:`JoinedIds`.

    Raises:
        ValueError: gradients of the wrong shape, or NaN or Inf (naming the table; nothing
            is changed).
    """

    def __init__(
        self,
        tables: Sequence[str],
        arrays: Sequence[np.ndarray],
        grads: Sequence[Any],
        dims: Sequence[int],
        dtypes: Sequence[RowDtype],
        num_shards: int,
    ) -> None:
        summed = []
        for table, ids, rows, dim in zip(tables, arrays, grads, dims, strict=True):
            try:
                summed.append(sum_duplicates(ids, grad_tensor(rows, len(ids), dim)))
            except ValueError as error:
                raise ValueError(f"table {table!r}: {error}") from None
        self.ids = JoinedIds(tables, [ids for ids, _ in summed], dims, dtypes, num_shards)
        by_table = dict(zip(tables, (rows for _, rows in summed)))
        self._grads = []
        for width in self.ids.widths:
            names = self.ids.tables[width.first : width.end]
            block = (
                torch.cat([by_table[n] for n in names]) if len(names) > 1 else by_table[names[0]]
            )
            try:
                check_finite(block, "grads")
            except ValueError:  # name the table
                for name in names:
                    check_finite(by_table[name], f"grads of table {name!r}")
                raise
            self._grads.append(block)

    def grad_entries(self, shard: int) -> list[tuple[str, np.ndarray, np.ndarray, RowDtype]]:
        """``(table, ids, gradient rows as they travel, dtype)`` of each table with ids on
        ``shard``, in the joined order.

        Raises:
            OutOfRangeError: a gradient beyond its table's wire dtype.
        """
        ids = self.ids
        part, bounds = ids.shards[shard], ids.shards[shard].bounds.tolist()
        entries = []
        for width, block in zip(ids.widths, self._grads):
            lo, hi = bounds[width.first], bounds[width.end]
            if hi == lo:
                continue
            rows = block.index_select(0, torch.from_numpy(part.positions[lo:hi] - width.start))
            packed = _packed_at_once(rows, part.ids[lo:hi], ids.block_dtype(shard, width))
            for t in range(width.first, width.end):
                start, end = bounds[t], bounds[t + 1]
                if end > start:
                    table, dtype = ids.tables[t], ids.dtypes[t]
                    shard_ids, what = part.ids[start:end], f"gradients of table {table!r}"
                    if packed is not None:
                        wire = packed[start - lo : end - lo]
                    else:
                        wire = rows_to_wire(rows[start - lo : end - lo], dtype, what, shard_ids)
                    entries.append((table, shard_ids, wire, dtype))
        return entries


def _packed_at_once(
    rows: torch.Tensor, row_ids: np.ndarray, dtype: RowDtype | None
) -> np.ndarray | None:
    """A block's rows packed in one call where all its tables travel in one packed
    ``dtype``; None where they do not, or where a row cannot travel (each table's own
    packing then names the table and id)."""
    if dtype is None or dtype is RowDtype.FLOAT32:
        return None
    try:
        return rows_to_wire(rows, dtype, "gradients", row_ids)
    except OutOfRangeError:
        return None
