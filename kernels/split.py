"""split_by_sorted_keys: which of a step's ids are in a sorted key set, in one pass; and
split_tables: the same for every table of a step in one call."""

from __future__ import annotations

from collections.abc import Sequence

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
    keys, ids = _checked("keys", keys), _checked("ids", ids)
    if not len(keys):  # every id is missing (tables without hot rows): nothing to search
        none = torch.empty(0, dtype=torch.int64, device=ids.device)
        return none, torch.arange(len(ids), device=ids.device), none
    if ids.device.type == "cpu" and keys.device.type == "cpu" and native_backend_for(ids):
        return torch.ops.ember.split_by_sorted_keys(keys, ids)
    return split_by_sorted_keys_reference(keys, ids)


def split_tables(
    keys: Sequence[torch.Tensor], ids: Sequence[torch.Tensor], key_start: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """:func:`split_by_sorted_keys` of several tables at once, on the host.

    Args:
        keys: each table's keys (1-D int64, ascending and distinct; not checked).
        ids: each table's ids (1-D int64).
        key_start: a number added to each table's key positions (where its keys start
            in an array that holds several tables').

    Returns:
        ``(found_at, missing_at, key_at, found_counts)``: positions among all tables' ids
        (table after table) of the ids found and of the others (both ascending), each
        found id's key position plus its table's ``key_start``, and how many ids of each
        table were found.

    Example:
        >>> split_tables([torch.tensor([3]), torch.tensor([5])],
        ...              [torch.tensor([3, 4]), torch.tensor([5])], [0, 10])
        (tensor([0, 2]), tensor([1]), tensor([ 0, 10]), [1, 1])
    """
    if not len(keys) == len(ids) == len(key_start):
        raise ValueError(
            f"keys, ids and key_start must have one entry per table, got {len(keys)}, "
            f"{len(ids)}, {len(key_start)}"
        )
    keys = [_checked("keys", t).cpu() for t in keys]
    ids = [_checked("ids", t).cpu() for t in ids]
    if ids and native_backend_for(ids[0]):
        found_at, missing_at, key_at, counts = torch.ops.ember.split_tables(
            keys, ids, list(key_start)
        )
        return found_at, missing_at, key_at, counts.tolist()
    parts, base = [], 0
    for table_keys, table_ids, start in zip(keys, ids, key_start):
        found, missing, key_at = split_by_sorted_keys(table_keys, table_ids)
        parts.append((found + base, missing + base, key_at + start))
        base += len(table_ids)
    if not parts:
        none = torch.empty(0, dtype=torch.int64)
        return none, none, none, []
    found_at, missing_at, key_at = (torch.cat(column) for column in zip(*parts))
    return found_at, missing_at, key_at, [len(found) for found, _, _ in parts]


def _checked(name: str, t: torch.Tensor) -> torch.Tensor:
    if t.dtype != torch.int64 or t.dim() != 1:
        raise ValueError(f"{name} must be a 1-D int64 tensor, got {t.dtype} {tuple(t.shape)}")
    return t.contiguous()


def split_by_sorted_keys_reference(
    keys: torch.Tensor, ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pure-torch definition (a binary search of every id) for non-empty ``keys``."""
    position = torch.searchsorted(keys, ids).clamp_(max=len(keys) - 1)
    found = keys.index_select(0, position) == ids
    found_at = found.nonzero().squeeze(1)
    return found_at, found.logical_not_().nonzero().squeeze(1), position.index_select(0, found_at)
