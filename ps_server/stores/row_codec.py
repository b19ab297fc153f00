"""The binary value of one row in an external store (Redis).

Little-endian: a 4-byte magic that names the format version (``EMR1``), the
row width and state width (uint32 each), the row's version (int64), then the
weights and the optimizer state as float32. Weights, state and version travel
in one value, so no tier can hold a row with slots from another moment.
"""

from __future__ import annotations

import numpy as np
import torch
from ember.ps_server.errors import StoreCorruptError
from ember.ps_server.stores.base import RowBatch

MAGIC = b"EMR1"
HEADER_BYTES = 20
DECODE_CHUNK_ROWS = 8192  # values decoded per scratch buffer (4-5 MB at dim 64)


def value_dtype(dim: int, state_width: int) -> np.dtype:
    """The numpy record layout of one value."""
    return np.dtype(
        [
            ("magic", "S4"),
            ("dim", "<u4"),
            ("state_width", "<u4"),
            ("version", "<i8"),
            ("weights", "<f4", (dim,)),
            ("state", "<f4", (state_width,)),
        ]
    )


def encode_records(rows: RowBatch) -> np.ndarray:
    """The values of ``rows`` as one record array (see :func:`value_dtype`)."""
    dim, width = rows.weights.shape[1], rows.state.shape[1]
    records = np.empty(len(rows.weights), dtype=value_dtype(dim, width))
    records["magic"] = MAGIC
    records["dim"] = dim
    records["state_width"] = width
    records["version"] = rows.versions.numpy()
    records["weights"] = rows.weights.numpy()
    records["state"] = rows.state.numpy()
    return records


def encode_rows(rows: RowBatch) -> list[bytes]:
    """One value per row of ``rows``."""
    records = encode_records(rows)
    size = records.dtype.itemsize
    blob = records.tobytes()
    return [blob[i : i + size] for i in range(0, len(blob), size)]


class RowRecords:
    """Row values read into one writable buffer, with tensor views to step them in place.

    ``weights`` and ``state`` are strided views into the records (an update
    writes straight into the values to send back); ``versions`` is a copy that
    :meth:`final` writes back.

    Raises:
        StoreCorruptError: a value of the wrong size, magic or widths (``where`` names the store).
    """

    def __init__(self, values: list[bytes], dim: int, state_width: int, where: str) -> None:
        dtype = value_dtype(dim, state_width)
        buffer = bytearray().join(values)
        if len(buffer) != len(values) * dtype.itemsize:  # then find the culprit, for the message
            bad = next(i for i, value in enumerate(values) if len(value) != dtype.itemsize)
            raise StoreCorruptError(
                f"{where}: a row value has {len(values[bad])} bytes, expected {dtype.itemsize} "
                f"(dim {dim}, state width {state_width}); the data was written for another table "
                "layout"
            )
        self.records = np.frombuffer(buffer, dtype=dtype)
        if len(self.records) and not (
            (self.records["magic"] == MAGIC).all()
            and (self.records["dim"] == dim).all()
            and (self.records["state_width"] == state_width).all()
        ):
            raise StoreCorruptError(
                f"{where}: a row value has an unknown header (expected {MAGIC!r})"
            )
        self.weights = torch.from_numpy(self.records["weights"])
        self.state = torch.from_numpy(self.records["state"])
        self.versions = torch.from_numpy(self.records["version"].copy())

    def final(self) -> np.ndarray:
        """The records, with the current versions written into them."""
        self.records["version"] = self.versions.numpy()
        return self.records


def decode_rows(
    values: list[bytes], dim: int, state_width: int, where: str, with_state: bool = True
) -> RowBatch:
    """Rows from values written by :func:`encode_rows` for the same widths.

    Decodes :data:`DECODE_CHUNK_ROWS` values at a time, so the scratch buffer
    stays small and reused however many rows come back. The state is left
    out (width 0) unless ``with_state``.

    Raises:
        StoreCorruptError: a value of the wrong size, magic or widths (``where`` names the store).
    """
    rows = len(values)
    batch = RowBatch(
        weights=torch.empty(rows, dim),
        state=torch.empty(rows, state_width if with_state else 0),
        versions=torch.empty(rows, dtype=torch.int64),
    )
    for start in range(0, rows, DECODE_CHUNK_ROWS):
        records = RowRecords(values[start : start + DECODE_CHUNK_ROWS], dim, state_width, where)
        part = slice(start, start + len(records.versions))
        batch.weights[part] = records.weights
        if with_state:
            batch.state[part] = records.state
        batch.versions[part] = records.versions
    return batch
