"""Deduplicating ids: unique_inverse (first-occurrence order, inverse index and counts) and
sorted_unique_inverse (ascending, with the inverse index)."""

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
    ids = _checked(ids)
    if native_backend_for(ids):
        return torch.ops.ember.unique_inverse(ids)
    return unique_inverse_reference(ids)


def sorted_unique_inverse(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct ids ascending and the inverse index (``ids == unique[inverse]``), as
    ``torch.unique(ids, sorted=True, return_inverse=True)`` gives them; on the host, a
    native pass that sorts only the distinct ids.

    Example:
        >>> sorted_unique_inverse(torch.tensor([7, 3, 7, 1]))
        (tensor([1, 3, 7]), tensor([2, 1, 2, 0]))
    """
    ids = _checked(ids)
    if ids.device.type == "cpu" and native_backend_for(ids):
        return torch.ops.ember.sorted_unique_inverse(ids)
    return torch.unique(ids, sorted=True, return_inverse=True)


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


def _checked(ids: torch.Tensor) -> torch.Tensor:
    if ids.dtype != torch.int64 or ids.dim() != 1:
        raise ValueError(f"ids must be a 1-D int64 tensor, got {ids.dtype} {tuple(ids.shape)}")
    return ids.contiguous()
