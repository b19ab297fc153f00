"""Rows and gradients packed for the wire, and widened back.

The shard keeps float32 rows and optimizer state whatever the wire carries
(see the .proto's ``RowDtype``): the sender packs float32 rows with the pack
op (round to nearest even, as ``Tensor.to``), the receiver widens them back
(exact). A value that the narrow type cannot hold would arrive as Inf, so
packing refuses it instead, naming the row.
"""

from __future__ import annotations

import numpy as np
import torch
from ember.kernels.pack import pack_rows, unpack_rows
from ember.ps_server.errors import InvalidArgumentError, OutOfRangeError
from ember.ps_server.wire.messages import readonly_tensor
from ember.ps_server.wire.row_dtype import RowDtype

TORCH_DTYPES = {
    RowDtype.FLOAT32: torch.float32,
    RowDtype.FLOAT16: torch.float16,
    RowDtype.BFLOAT16: torch.bfloat16,
}


# The exponent field of each packed dtype: all ones is infinity or NaN.
_EXPONENT_BITS = {RowDtype.FLOAT16: np.uint16(0x7C00), RowDtype.BFLOAT16: np.uint16(0x7F80)}


def rows_to_wire(rows: torch.Tensor, dtype: RowDtype, what: str, ids: np.ndarray) -> np.ndarray:
    """Float32 ``rows`` [n, dim] of ``ids`` as they travel: a float32 array, or the bit
    patterns of the packed rows as uint16, same shape.

    Raises:
        OutOfRangeError: a value beyond ``dtype``'s range (nothing is packed), naming
            ``what`` and the row's id.
    """
    if dtype is RowDtype.FLOAT32:
        return rows.contiguous().numpy()
    bits = _packed_bits(rows, dtype)
    not_finite = packed_not_finite(bits, dtype)
    if not_finite.any():
        row = int(np.flatnonzero(not_finite.any(axis=1))[0])
        raise OutOfRangeError(f"{what}: the row of id {int(ids[row])} {_beyond(rows[row], dtype)}")
    return bits


def packed_at_once(rows: torch.Tensor, dtype: RowDtype) -> np.ndarray | None:
    """Float32 ``rows`` of any shape (several tables' back to back) packed as ``dtype`` (a
    packed one) in one call, their bits as uint16; None where a value cannot travel as it
    (each table's own :func:`rows_to_wire` then names the row)."""
    bits = _packed_bits(rows, dtype)
    return None if packed_not_finite(bits, dtype).any() else bits


def _packed_bits(rows: torch.Tensor, dtype: RowDtype) -> np.ndarray:
    """Float32 ``rows`` packed as ``dtype`` (a packed one), their bits as uint16."""
    return pack_rows(rows, TORCH_DTYPES[dtype]).view(torch.int16).numpy().view(np.uint16)


def packed_not_finite(bits: np.ndarray, dtype: RowDtype) -> np.ndarray:
    """Whether each packed float16 / bfloat16 value (its bits as uint16) is infinite or
    NaN: its exponent bits are all ones. A numpy test on the bits costs a fraction of
    torch's isfinite over the packed tensor."""
    exponent = _EXPONENT_BITS[dtype]
    return (bits & exponent) == exponent


def rows_from_wire(
    buffer: bytes | memoryview, dtype: RowDtype, num_rows: int, dim: int, what: str
) -> np.ndarray:
    """The float32 rows [num_rows, dim] of a received ``buffer``: a view of it for float32
    (read-only when the buffer is), else a new array.

    Raises:
        InvalidArgumentError: the byte length is not ``num_rows * dim`` elements.
    """
    expected = num_rows * dim * dtype.itemsize
    if len(buffer) != expected:
        raise InvalidArgumentError(
            f"{what} must hold {num_rows} ids x dim {dim} {dtype.name.lower()} = {expected} "
            f"bytes, got {len(buffer)}"
        )
    if dtype is RowDtype.FLOAT32:
        return np.frombuffer(buffer, dtype="<f4").reshape(num_rows, dim)
    packed = readonly_tensor(buffer, TORCH_DTYPES[dtype]).view(num_rows, dim)
    return unpack_rows(packed).numpy()


def _beyond(row: torch.Tensor, dtype: RowDtype) -> str:
    """Why ``row`` cannot travel as ``dtype``, and what to send instead."""
    if not bool(torch.isfinite(row).all()):
        return "holds a value that is not finite"
    limit = torch.finfo(TORCH_DTYPES[dtype]).max
    wider = "bfloat16 or float32" if dtype is RowDtype.FLOAT16 else "float32"
    return (
        f"holds {float(row.abs().max()):.6g}, beyond the range of {dtype.name.lower()} "
        f"(max {limit:.6g}); send this table as {wider}"
    )
