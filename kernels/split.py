"""split_tables: which of a step's ids are in each table's sorted key set, every table in one
call (the trainer's hot/cold split)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from ember.kernels.loader import native_backend_for


def split_tables(
    keys: Sequence[torch.Tensor], ids: Sequence[torch.Tensor], key_start: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """Split each table's ids by membership in its keys, on the host.

    Args:
        keys: each table's keys (1-D int64, ascending and distinct; not checked here: a
            check would cost a pass over every key per call; check them once where they
            are made).
        ids: each table's ids (1-D int64, duplicates allowed).
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
        found, missing, key_at = _split_reference(table_keys, table_ids)
        parts.append((found + base, missing + base, key_at + start))
        base += len(table_ids)
    if not parts:
        none = torch.empty(0, dtype=torch.int64)
        return none, none, none, []
    found_at, missing_at, key_at = (torch.cat(column) for column in zip(*parts))
    return found_at, missing_at, key_at, [len(found) for found, _, _ in parts]


def _split_reference(
    keys: torch.Tensor, ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One table's split, in torch: a binary search of every id."""
    if not len(keys):  # every id is missing
        none = torch.empty(0, dtype=torch.int64)
        return none, torch.arange(len(ids)), none
    position = torch.searchsorted(keys, ids).clamp_(max=len(keys) - 1)
    found = keys.index_select(0, position) == ids
    found_at = found.nonzero().squeeze(1)
    return found_at, found.logical_not_().nonzero().squeeze(1), position.index_select(0, found_at)


def _checked(name: str, t: torch.Tensor) -> torch.Tensor:
    if t.dtype != torch.int64 or t.dim() != 1:
        raise ValueError(f"{name} must be a 1-D int64 tensor, got {t.dtype} {tuple(t.shape)}")
    return t.contiguous()
