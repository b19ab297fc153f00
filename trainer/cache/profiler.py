"""FAE's profiling pass: count (table, id) over sample batches and pick the hot set."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from ember.trainer.data.batch import Batch

# Per cached row: weights and pending gradient (float32 each) plus id, held
# version, local-update count, last use and frequency (int64 each).
CACHE_BYTES_PER_ELEMENT = 8
CACHE_BYTES_PER_ROW_FIXED = 5 * 8


def cache_bytes_per_row(dim: int) -> int:
    """Memory one row of a HotEmbeddingCache costs."""
    return dim * CACHE_BYTES_PER_ELEMENT + CACHE_BYTES_PER_ROW_FIXED


def replica_bytes_per_row(dim: int, state_floats: int) -> int:
    """Memory one replicated hot row costs: weights and optimizer state (float32), id and
    step count (int64) and its written-back flag (one byte)."""
    return 4 * (dim + state_floats) + 8 + 8 + 1


def count_ids(
    batches: Iterable[Batch], feature_tables: Sequence[str]
) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], int]:
    """``({table: (ascending distinct ids, their counts)}, samples)`` over ``batches``;
    every table present (possibly empty).

    Raises:
        ValueError: a batch whose feature count is not ``len(feature_tables)``.
    """
    tables = list(dict.fromkeys(feature_tables))
    seen: dict[str, list[torch.Tensor]] = {t: [] for t in tables}
    samples = 0
    for batch in batches:
        if len(batch.sparse) != len(feature_tables):
            raise ValueError(
                f"the profile names {len(feature_tables)} features, a batch has {len(batch.sparse)}"
            )
        samples += batch.batch_size
        for feature, table in zip(batch.sparse, feature_tables):
            seen[table].append(feature.values)
    empty = torch.empty(0, dtype=torch.int64)
    return {
        table: torch.unique(torch.cat(seen[table] or [empty]), return_counts=True)
        for table in tables
    }, samples


def profile_hot_ids(
    batches: Iterable[Batch], feature_tables: Sequence[str], budget_bytes: int, per_row: int
) -> dict[str, torch.Tensor]:
    """The most frequent (table, id) pairs that fit ``budget_bytes`` at ``per_row`` bytes
    each (ties: table order, then ascending id).

    Returns:
        ``{table: ids}`` (ascending ids), every table present (possibly empty).

    Raises:
        ValueError: the budget cannot hold a single row.
    """
    capacity = budget_bytes // per_row
    if capacity < 1:
        raise ValueError(f"a budget of {budget_bytes} bytes holds no row ({per_row} bytes each)")
    counted, _ = count_ids(batches, feature_tables)
    tables = list(counted)
    ids = torch.cat([counted[t][0] for t in tables])
    counts = torch.cat([counted[t][1] for t in tables])
    owners = torch.cat([torch.full_like(counted[t][0], number) for number, t in enumerate(tables)])
    keep = torch.argsort(counts, descending=True, stable=True)[:capacity]  # clamped to ids seen
    return {
        table: torch.sort(ids[keep][owners[keep] == number]).values
        for number, table in enumerate(tables)
    }
