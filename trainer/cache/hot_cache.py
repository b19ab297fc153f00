"""HotEmbeddingCache: a table's hot rows on the trainer, with bounded staleness.

Each cached row carries the version it was read at (``held_versions``), the
gradients applied to it locally but not yet pushed (``pending``) and how many
local updates those are. The row source around the cache (``CachedRowSource``)
refreshes a row when the shard's version is more than ``pull_bound`` ahead,
and pushes a row's pending gradient once it has ``max(1, push_bound)`` local
updates, when the row is evicted, and on ``drain()``. Bounds of 0 give fully
synchronous semantics: every step pushes and the next step re-reads.

Policies: ``static`` caches a fixed hot set chosen by a profiling pass (FAE);
``lru`` and ``lfu`` admit every missed id and evict the least recently / least
frequently (then least recently) used row that the current batch does not use.

The id -> slot index is the kernels' hash map (:class:`IdIndex`) on the
cache's device and free slots are a tensor stack, so no step does per-id Python.
"""

from __future__ import annotations

import dataclasses

import torch
from ember.kernels.id_index import IdIndex
from ember.kernels.rows import scatter_add_rows, scatter_rows

POLICIES = ("static", "lru", "lfu")


@dataclasses.dataclass
class CacheStats:
    """Counters of one cache."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    refreshes: int = 0
    max_version_lag: int = 0

    @property
    def hit_rate(self) -> float:
        """hits / (hits + misses), 0 before any lookup."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class HotEmbeddingCache:
    """Cached rows of one table.

    Args:
        dim: row width.
        capacity: rows the cache holds (>= 1).
        policy: "static", "lru" or "lfu".
        pull_bound: versions a cached row may lag the shard before it is refreshed.
        push_bound: local updates a row may accumulate before they are pushed.
        local_lr: step size of the local SGD update applied to cached copies.
        hot_ids: the static hot set (policy "static" only); at most ``capacity`` ids.
        device: where rows live ("cpu" or "cuda").
    """

    def __init__(
        self,
        dim: int,
        capacity: int,
        policy: str,
        pull_bound: int = 0,
        push_bound: int = 0,
        local_lr: float = 0.0,
        hot_ids: torch.Tensor | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        if capacity < 1:
            raise ValueError(f"cache capacity must be >= 1 row, got {capacity}")
        if pull_bound < 0 or push_bound < 0:
            raise ValueError(
                f"pull_bound and push_bound must be >= 0, got {pull_bound}, {push_bound}"
            )
        if (policy == "static") != (hot_ids is not None):
            raise ValueError("hot_ids are required by the static policy and only by it")
        if hot_ids is not None and len(hot_ids) > capacity:
            raise ValueError(f"{len(hot_ids)} hot ids do not fit a capacity of {capacity} rows")
        self.dim, self.capacity, self.policy = dim, capacity, policy
        self.pull_bound, self.push_bound, self.local_lr = pull_bound, push_bound, local_lr
        self.device = torch.device(device)
        self.weights = torch.zeros(capacity, dim, device=self.device)
        self.pending = torch.zeros(capacity, dim, device=self.device)
        self.held_versions = torch.zeros(capacity, dtype=torch.int64)
        self.local_updates = torch.zeros(capacity, dtype=torch.int64)
        self.last_used = torch.zeros(capacity, dtype=torch.int64)
        self.frequency = torch.zeros(capacity, dtype=torch.int64)
        self.ids = torch.full((capacity,), -1, dtype=torch.int64)
        self._index = IdIndex(capacity, device=self.device)
        self._free = torch.arange(
            capacity - 1, -1, -1, dtype=torch.int64
        )  # a stack: top at the end
        self._free_count = capacity
        self._clock = 0
        self.hot_ids = None if hot_ids is None else torch.as_tensor(hot_ids, dtype=torch.int64)
        self.stats = CacheStats()

    def __len__(self) -> int:
        return len(self._index)

    def peek(self, ids: torch.Tensor) -> torch.Tensor:
        """Slot of each id, -1 where not cached; no side effects."""
        return self._index.find(ids.to(self.device)).cpu()

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Slot of each distinct id, -1 for a miss; marks hits as used now."""
        self._clock += 1
        slots = self.peek(ids)
        hit = slots >= 0
        self.stats.hits += int(hit.sum())
        self.stats.misses += int((~hit).sum())
        used = slots[hit]
        self.last_used[used] = self._clock
        self.frequency[used] += 1
        return slots

    def admissible(self, ids: torch.Tensor) -> torch.Tensor:
        """Which missed ids the policy would cache (the static set, or all for lru/lfu)."""
        if self.hot_ids is None:
            return torch.ones(len(ids), dtype=torch.bool)
        return torch.isin(ids, self.hot_ids)

    def victims(self, count: int, pinned: torch.Tensor) -> torch.Tensor:
        """Up to ``count`` slots to evict, never one in ``pinned``; least valuable first."""
        occupied = self.ids >= 0
        occupied[pinned] = False
        candidates = occupied.nonzero().squeeze(1)
        if self.policy == "lfu":
            key = self.frequency[candidates] * (self._clock + 1) + self.last_used[candidates]
        else:
            key = self.last_used[candidates]
        order = torch.argsort(key, stable=True)
        return candidates[order[:count]]

    def evict(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Drop ``slots``; returns ``(ids, pending grads)`` of those with unpushed updates."""
        dirty = slots[self.local_updates[slots] > 0]
        write_back = (self.ids[dirty].clone(), self.pending[dirty].clone())
        self._index.erase(self.ids[slots].to(self.device))
        self._free[self._free_count : self._free_count + len(slots)] = slots
        self._free_count += len(slots)
        self.ids[slots] = -1
        self.pending[slots] = 0.0
        self.local_updates[slots] = 0
        self.stats.evictions += len(slots)
        return write_back

    def free_slots(self) -> int:
        """Slots not holding a row."""
        return self._free_count

    def insert(self, ids: torch.Tensor, rows: torch.Tensor, versions: torch.Tensor) -> torch.Tensor:
        """Cache new rows (as many as there are free slots); returns their slots."""
        if len(ids) > self._free_count:
            raise ValueError(f"{len(ids)} rows do not fit the {self._free_count} free slots")
        top = self._free_count
        slots = self._free[top - len(ids) : top].flip(0)
        self._free_count -= len(ids)
        self._index.insert(ids.to(self.device), slots.to(self.device))
        self.ids[slots] = ids
        scatter_rows(self.weights, slots.to(self.device), rows.to(self.device).contiguous())
        self.held_versions[slots] = versions
        self.pending[slots] = 0.0
        self.local_updates[slots] = 0
        self.last_used[slots] = self._clock
        self.frequency[slots] = 1
        return slots

    def refresh(self, slots: torch.Tensor, rows: torch.Tensor, versions: torch.Tensor) -> None:
        """Replace stale copies by the shard's rows, re-applying the still-unpushed local updates."""
        lag = versions - self.held_versions[slots]
        if len(lag):
            self.stats.max_version_lag = max(self.stats.max_version_lag, int(lag.max()))
        self.weights[slots] = rows.to(self.device) - self.local_lr * self.pending[slots]
        self.held_versions[slots] = versions
        self.stats.refreshes += len(slots)

    def accumulate(
        self, slots: torch.Tensor, grads: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Apply gradients locally; returns ``(ids, grads)`` of rows due for a push (then cleared)."""
        grads = grads.to(self.device).contiguous()
        device_slots = slots.to(self.device)
        if self.local_lr:
            scatter_add_rows(self.weights, device_slots, grads * -self.local_lr)
        scatter_add_rows(self.pending, device_slots, grads)
        self.local_updates[slots] += 1
        due = slots[self.local_updates[slots] >= max(1, self.push_bound)]
        return self._take_pending(due)

    def drain(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids, grads)`` of every row with unpushed updates (then cleared)."""
        return self._take_pending((self.local_updates > 0).nonzero().squeeze(1))

    def _take_pending(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        taken = (self.ids[slots].clone(), self.pending[slots].cpu().clone())
        self.pending[slots] = 0.0
        self.local_updates[slots] = 0
        return taken
