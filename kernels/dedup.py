"""unique_inverse: distinct ids in first-occurrence order, inverse index and counts."""

from __future__ import annotations

import torch
from ember.kernels.loader import native_backend_for


def unique_inverse(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Deduplicate ids.

    Args:
        ids: 1-D int64 tensor (any values, duplicates allowed).

    Returns:
        ``(unique, inverse, counts)``: the distinct ids in order of first occurrence,
        ``inverse`` with ``ids == unique[inverse]``, and each distinct id's count.

    Example:
        >>> unique_inverse(torch.tensor([7, 3, 7, 1]))
        (tensor([7, 3, 1]), tensor([0, 1, 0, 2]), tensor([2, 1, 1]))
    """
    if ids.dtype != torch.int64 or ids.dim() != 1:
        raise ValueError(f"ids must be a 1-D int64 tensor, got {ids.dtype} {tuple(ids.shape)}")
    ids = ids.contiguous()
    if native_backend_for(ids):
        return torch.ops.ember.unique_inverse(ids)
    return unique_inverse_reference(ids)


def unique_inverse_reference(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pure-torch definition: sorted unique, then reordered by first occurrence."""
    ordered, inverse, counts = torch.unique(
        ids, sorted=True, return_inverse=True, return_counts=True
    )
    positions = torch.arange(len(ids), device=ids.device)
    first = torch.full_like(ordered, len(ids)).scatter_reduce_(0, inverse, positions, "amin")
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order), device=ids.device)
    return ordered[order], rank[inverse], counts[order]
