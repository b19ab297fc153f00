"""Deduplicating ids: unique_inverse (first-occurrence order, inverse index and counts) and
plan_features (a training step's sparse features: every table's distinct ids ascending, at
once)."""

from __future__ import annotations

from collections.abc import Sequence

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


def plan_features(
    values: Sequence[torch.Tensor],
    offsets: Sequence[torch.Tensor],
    table_of: Sequence[int],
    num_tables: int,
) -> tuple[list[torch.Tensor], torch.Tensor, list[bool]]:
    """Deduplicate the ids of several jagged features, each looked up in one of
    ``num_tables`` tables (features may share a table), in one call.

    Args:
        values, offsets: each feature's ids (int64, >= 0) and bag offsets (int64, rising
            from 0 to its number of ids), on the host.
        table_of: each feature's table number, in ``[0, num_tables)``.

    Returns:
        ``(unique, inverse, one_id_bags)``: each table's distinct ids ascending; each id's
        row among all tables' distinct ids in table order (``cat(unique)[inverse]`` is
        ``cat(values)``); and, per feature, whether every bag holds exactly one id.

    Raises:
        ValueError: naming the first malformed feature.

    Example:
        >>> one = torch.tensor([0, 1, 2])
        >>> plan_features([torch.tensor([9, 4]), torch.tensor([4, 4])], [one, one], [0, 1], 2)
        ([tensor([4, 9]), tensor([4])], tensor([1, 0, 2, 2]), [True, True])
    """
    if not len(values) == len(offsets) == len(table_of):
        raise ValueError(
            f"values, offsets and table_of must have one entry per feature, got "
            f"{len(values)}, {len(offsets)}, {len(table_of)}"
        )
    for f, (ids, bounds) in enumerate(zip(values, offsets)):
        if ids.dtype != torch.int64 or bounds.dtype != torch.int64:
            raise ValueError(
                f"feature {f}: ids and offsets must be int64 tensors, got {ids.dtype}, {bounds.dtype}"
            )
        if ids.dim() != 1 or bounds.dim() != 1 or len(bounds) < 1:
            raise ValueError(f"feature {f}: ids and offsets must be 1-D with at least one offset")
    values = [ids.cpu().contiguous() for ids in values]
    offsets = [bounds.cpu().contiguous() for bounds in offsets]
    if values and native_backend_for(values[0]):
        unique, inverse, one_id_bags = torch.ops.ember.plan_features(
            values, offsets, list(table_of), num_tables
        )
        return list(unique), inverse, one_id_bags.tolist()
    return plan_features_reference(values, offsets, table_of, num_tables)


def plan_features_reference(
    values: Sequence[torch.Tensor],
    offsets: Sequence[torch.Tensor],
    table_of: Sequence[int],
    num_tables: int,
) -> tuple[list[torch.Tensor], torch.Tensor, list[bool]]:
    """The pure-torch definition of :func:`plan_features` (after its type checks)."""
    one_id_bags = []
    for f, (ids, bounds) in enumerate(zip(values, offsets)):
        if not 0 <= table_of[f] < num_tables:
            raise ValueError(f"feature {f}: table {table_of[f]} is out of range [0, {num_tables})")
        if len(ids) and int(ids.min()) < 0:
            raise ValueError(f"feature {f}: ids must be >= 0, got {int(ids.min())}")
        falls = bool((bounds[1:] < bounds[:-1]).any())  # compared, not subtracted: no overflow
        if int(bounds[0]) != 0 or int(bounds[-1]) != len(ids) or falls:
            raise ValueError(f"feature {f}: offsets must rise from 0 to len(ids) = {len(ids)}")
        one_id_bags.append(len(ids) == len(bounds) - 1 and bool((bounds.diff() == 1).all()))
    unique, inverse, row = [], [torch.empty(0, dtype=torch.int64)] * len(values), 0
    for table in range(num_tables):
        members = [f for f in range(len(values)) if table_of[f] == table]
        ids = (
            torch.cat([values[f] for f in members])
            if members
            else torch.empty(0, dtype=torch.int64)
        )
        distinct, positions = torch.unique(ids, sorted=True, return_inverse=True)
        for f, part in zip(members, positions.split([len(values[f]) for f in members])):
            inverse[f] = part + row
        unique.append(distinct)
        row += len(distinct)
    return unique, torch.cat(inverse) if inverse else torch.empty(0, dtype=torch.int64), one_id_bags


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
