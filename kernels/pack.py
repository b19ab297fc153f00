"""Packing float32 rows to float16 / bfloat16 and back, for the wire.

Round-to-nearest-even, exactly as ``rows.to(dtype)``: the reference is that
conversion; the native op does it in one pass without torch's dispatch.
"""

from __future__ import annotations

import torch
from ember.kernels.loader import native_backend_for

PACKED_DTYPES = (torch.float16, torch.bfloat16)


def pack_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 ``rows`` as ``dtype`` (float16 or bfloat16), same shape.

    Raises:
        ValueError: rows not float32, or a dtype other than float16 / bfloat16.
    """
    if rows.dtype != torch.float32:
        raise ValueError(f"pack_rows takes float32 rows, got {rows.dtype}")
    if dtype not in PACKED_DTYPES:
        raise ValueError(f"pack_rows packs to float16 or bfloat16, got {dtype}")
    rows = rows.contiguous()
    if native_backend_for(rows):
        return torch.ops.ember.pack_rows(rows, dtype)
    return rows.to(dtype)


def unpack_rows(packed: torch.Tensor) -> torch.Tensor:
    """float16 / bfloat16 rows widened to float32 (exact)."""
    if packed.dtype not in PACKED_DTYPES:
        raise ValueError(f"unpack_rows takes float16 or bfloat16 rows, got {packed.dtype}")
    packed = packed.contiguous()
    if native_backend_for(packed):
        return torch.ops.ember.unpack_rows(packed)
    return packed.to(torch.float32)
