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
    """Memory one cached row costs."""
    return dim * CACHE_BYTES_PER_ELEMENT + CACHE_BYTES_PER_ROW_FIXED


def profile_hot_ids(
    batches: Iterable[Batch], feature_tables: Sequence[str], budget_bytes: int, dim: int
) -> dict[str, torch.Tensor]:
    """The most frequent (table, id) pairs that fit ``budget_bytes`` of cache.

    Returns:
        ``{table: ids}`` (ascending ids), every table present (possibly empty).

    Raises:
        ValueError: the budget cannot hold a single row.
    """
    per_row = cache_bytes_per_row(dim)
    capacity = budget_bytes // per_row
    if capacity < 1:
        raise ValueError(
            f"a cache budget of {budget_bytes} bytes holds no row of dim {dim} ({per_row} bytes each)"
        )
    tables = list(dict.fromkeys(feature_tables))
    seen: dict[str, list[torch.Tensor]] = {t: [] for t in tables}
    for batch in batches:
        for feature, table in zip(batch.sparse, feature_tables):
            seen[table].append(feature.values)
    candidates = []
    for number, table in enumerate(tables):
        ids, counts = torch.unique(
            torch.cat(seen[table] or [torch.empty(0, dtype=torch.int64)]), return_counts=True
        )
        candidates.append((ids, counts, torch.full_like(ids, number)))
    ids = torch.cat([c[0] for c in candidates])
    counts = torch.cat([c[1] for c in candidates])
    owners = torch.cat([c[2] for c in candidates])
    keep = torch.argsort(counts, descending=True, stable=True)[:capacity]  # clamped to ids seen
    return {
        table: torch.sort(ids[keep][owners[keep] == number]).values
        for number, table in enumerate(tables)
    }
