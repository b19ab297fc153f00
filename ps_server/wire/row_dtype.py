"""How rows and gradients travel in step messages: float32, or packed to float16 / bfloat16.

The shard keeps float32 rows and optimizer state whatever the wire carries
(see the .proto's ``RowDtype``): the sender packs float32 rows with the pack
op (round to nearest even, as ``Tensor.to``), the receiver widens them back
(exact). A finite value that the narrow type cannot hold would arrive as Inf,
so packing refuses it instead, naming the row.
"""

from __future__ import annotations

import enum

import numpy as np
import torch
from ember.kernels.pack import pack_rows, unpack_rows
from ember.ps_server.errors import InvalidArgumentError, OutOfRangeError
from ember.ps_server.wire.messages import pb, readonly_tensor


class RowDtype(enum.IntEnum):
    """A table's rows on the wire; values are the .proto's ``RowDtype`` numbers."""

    FLOAT32 = pb.FLOAT32
    FLOAT16 = pb.FLOAT16
    BFLOAT16 = pb.BFLOAT16

    @property
    def torch_dtype(self) -> torch.dtype:
        """The torch dtype of one element."""
        return _TORCH_DTYPES[self]

    @property
    def itemsize(self) -> int:
        """Bytes of one element."""
        return 4 if self is RowDtype.FLOAT32 else 2

    @classmethod
    def parse(cls, name: str) -> RowDtype:
        """``float32``, ``float16`` or ``bfloat16`` (as torch names them).

        Raises:
            ValueError: any other name.
        """
        try:
            return cls[name.upper()]
        except KeyError:
            names = ", ".join(d.name.lower() for d in cls)
            raise ValueError(f"row dtype must be one of {names}, got {name!r}") from None

    @classmethod
    def from_wire(cls, number: int) -> RowDtype:
        """A message's dtype field.

        Raises:
            InvalidArgumentError: a number the .proto does not define.
        """
        try:
            return cls(number)
        except ValueError:
            raise InvalidArgumentError(
                f"unknown row dtype {number}; the wire carries "
                + ", ".join(f"{d.value} ({d.name.lower()})" for d in cls)
            ) from None


_TORCH_DTYPES = {
    RowDtype.FLOAT32: torch.float32,
    RowDtype.FLOAT16: torch.float16,
    RowDtype.BFLOAT16: torch.bfloat16,
}


def rows_to_wire(rows: torch.Tensor, dtype: RowDtype, what: str) -> np.ndarray:
    """Float32 ``rows`` [n, dim] as they travel: a float32 array, or the bit patterns of
    the packed rows as uint16, same shape.

    Raises:
        OutOfRangeError: a value beyond ``dtype``'s range (nothing is packed), naming
            ``what`` and the row.
    """
    if dtype is RowDtype.FLOAT32:
        return rows.contiguous().numpy()
    packed = pack_rows(rows, dtype.torch_dtype)
    finite = torch.isfinite(packed).all(dim=1)
    if not bool(finite.all()):
        row = int(torch.nonzero(~finite)[0, 0])
        largest = float(rows[row].abs().max())
        raise OutOfRangeError(
            f"{what}: row {row} holds {largest:.6g}, beyond the range of "
            f"{dtype.name.lower()} (max {torch.finfo(dtype.torch_dtype).max:.6g}); "
            "send this table as bfloat16 or float32"
        )
    return packed.view(torch.int16).numpy().view(np.uint16)


def rows_from_wire(
    buffer: bytes | memoryview, dtype: RowDtype, num_rows: int, dim: int, what: str
) -> torch.Tensor:
    """The float32 rows [num_rows, dim] of a received ``buffer``: a read-only view of it for
    float32 (callers must not write to it), else a new tensor.

    Raises:
        InvalidArgumentError: the byte length is not ``num_rows * dim`` elements.
    """
    expected = num_rows * dim * dtype.itemsize
    if len(buffer) != expected:
        raise InvalidArgumentError(
            f"{what} must hold {num_rows} ids x dim {dim} {dtype.name.lower()} = {expected} "
            f"bytes, got {len(buffer)}"
        )
    rows = readonly_tensor(buffer, dtype.torch_dtype).view(num_rows, dim)
    return rows if dtype is RowDtype.FLOAT32 else unpack_rows(rows)
