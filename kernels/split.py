"""split_by_sorted_keys: which of a step's ids are in a sorted key set, in one pass."""

from __future__ import annotations

import torch
from ember.kernels.loader import native_backend_for


def split_by_sorted_keys(
    keys: torch.Tensor, ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split ``ids`` by membership in ``keys``.

    Args:
        keys: 1-D int64, ascending and distinct (not checked here: a check would cost a
            pass over every key per call; check them once where they are made).
        ids: 1-D int64 (duplicates allowed).

    Returns:
        ``(found_at, missing_at, key_at)``: the ascending positions of the ids that are
        keys and of those that are not, and each found id's position among the keys.

    Example:
        >>> split_by_sorted_keys(torch.tensor([3, 8]), torch.tensor([8, 5, 3]))
        (tensor([0, 2]), tensor([1]), tensor([1, 0]))
    """
    for name, t in (("keys", keys), ("ids", ids)):
        if t.dtype != torch.int64 or t.dim() != 1:
            raise ValueError(f"{name} must be a 1-D int64 tensor, got {t.dtype} {tuple(t.shape)}")
    keys, ids = keys.contiguous(), ids.contiguous()
    if not len(keys):  # every id is missing (tables without hot rows): nothing to search
        none = torch.empty(0, dtype=torch.int64, device=ids.device)
        return none, torch.arange(len(ids), device=ids.device), none
    if ids.device.type == "cpu" and keys.device.type == "cpu" and native_backend_for(ids):
        return torch.ops.ember.split_by_sorted_keys(keys, ids)
    return split_by_sorted_keys_reference(keys, ids)


def split_by_sorted_keys_reference(
    keys: torch.Tensor, ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pure-torch definition (a binary search of every id) for non-empty ``keys``."""
    position = torch.searchsorted(keys, ids).clamp_(max=len(keys) - 1)
    found = keys.index_select(0, position) == ids
    found_at = found.nonzero().squeeze(1)
    return found_at, found.logical_not_().nonzero().squeeze(1), position.index_select(0, found_at)
