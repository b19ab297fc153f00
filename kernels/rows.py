"""Row gather, scatter and deterministic scatter-add by index.

Native ops when they serve the tensors' device, else the pure-torch reference
(``index_select`` / ``index_copy_`` / ``index_add_``), which is also the
definition the tests check against. Shapes, dtypes and contiguity are checked
here for both backends; an index out of range raises before anything is written.
"""

from __future__ import annotations

import torch
from ember.kernels.loader import native_backend_for


def gather_rows(src: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out[i] = src[index[i]]``; returns ``out``.

    Raises:
        ValueError: mismatched dtypes, devices or row shapes, a non-contiguous tensor,
            or an index that is not 1-D int64 with one entry per row of ``out``.
        RuntimeError / IndexError: an index out of range.
    """
    _check(src, index, out, "src", "out")
    if native_backend_for(src):
        torch.ops.ember.gather_rows(src, index, out)
    else:
        torch.index_select(src, 0, index, out=out)
    return out


def scatter_rows(dst: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst[index[i]] = src[i]``; returns ``dst``. Same checks as :func:`gather_rows`."""
    _check(dst, index, src, "dst", "src")
    if native_backend_for(dst):
        torch.ops.ember.scatter_rows(dst, index, src)
    else:
        _check_range(index, len(dst))
        dst.index_copy_(0, index, src)
    return dst


def scatter_add_rows(dst: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst[index[i]] += src[i]`` in order of ``i`` (deterministic); returns ``dst``.

    The segment sum of gradient rows: with ``index`` the inverse of
    :func:`ember.kernels.dedup.unique_inverse`, row ``u`` of a zeroed ``dst`` becomes the
    sum of the gradients of every occurrence of the ``u``-th distinct id.
    """
    _check(dst, index, src, "dst", "src")
    if not dst.is_floating_point():
        raise ValueError(f"scatter_add_rows takes floating-point rows, got {dst.dtype}")
    if native_backend_for(dst):
        torch.ops.ember.scatter_add_rows(dst, index, src)
    else:
        _check_range(index, len(dst))
        dst.index_add_(0, index, src)
    return dst


def _check(
    table: torch.Tensor, index: torch.Tensor, rows: torch.Tensor, table_name: str, rows_name: str
) -> None:
    """``table`` is indexed by ``index``, one entry per row of ``rows``."""
    if table.dtype != rows.dtype or table.shape[1:] != rows.shape[1:]:
        raise ValueError(
            f"{table_name} and {rows_name} rows differ: {table.dtype} {tuple(table.shape)} "
            f"vs {rows.dtype} {tuple(rows.shape)}"
        )
    if table.dim() < 1 or not (table.is_contiguous() and rows.is_contiguous()):
        raise ValueError(f"{table_name} and {rows_name} must be contiguous with >= 1 dimension")
    if index.dtype != torch.int64 or index.dim() != 1 or not index.is_contiguous():
        raise ValueError(
            f"index must be a contiguous 1-D int64 tensor, got {index.dtype} {tuple(index.shape)}"
        )
    if len(index) != len(rows):
        raise ValueError(f"index has {len(index)} entries, {rows_name} has {len(rows)} rows")
    if not table.device == index.device == rows.device:
        raise ValueError(f"{table_name}, index and {rows_name} must share a device")


def _check_range(index: torch.Tensor, bound: int) -> None:
    """torch's scatters may write some rows before refusing a bad index: check first."""
    if len(index) and (int(index.min()) < 0 or int(index.max()) >= bound):
        raise IndexError(
            f"index out of range [0, {bound}): min {int(index.min())}, max {int(index.max())}"
        )
