"""Row gather and scatter by index, native when available, else torch.

The native ops copy rows on the calling thread with prefetching; the torch
reference (``index_select`` / ``index_copy_``) is the fallback and the
definition the tests check against.
"""

from __future__ import annotations

import torch
from ember.kernels.loader import native_ops_available


def gather_rows(src: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out[i] = src[index[i]]`` for contiguous CPU tensors; returns ``out``.

    Raises:
        RuntimeError / IndexError: mismatched dtypes or row shapes, or an index out of range.
    """
    if native_ops_available():
        torch.ops.ember.gather_rows(src, index, out)
    else:
        torch.index_select(src, 0, index, out=out)
    return out


def scatter_rows(dst: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst[index[i]] = src[i]`` for contiguous CPU tensors; returns ``dst``."""
    if native_ops_available():
        torch.ops.ember.scatter_rows(dst, index, src)
    else:
        dst.index_copy_(0, index, src)
    return dst
