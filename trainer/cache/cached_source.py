"""CachedRowSource: rows from HotEmbeddingCaches in front of the parameter servers.

Per lookup: cached rows whose shard version is more than ``pull_bound`` ahead
are refreshed (a conditional pull: 16 bytes per row unless stale); misses are
pulled in the same round trip, then admitted by the policy (evicting, with
write-back, what the batch does not use) or passed through uncached. Per update: cached rows take the
gradient locally and push it when due; uncached rows push at once. All shard
traffic for all tables of a step goes out in one concurrent fan-out per kind.
"""

from __future__ import annotations

import torch
from ember.ps_server.client import PSClient
from ember.trainer.cache.hot_cache import HotEmbeddingCache
from ember.trainer.traffic import CountingClient


class CachedRowSource:
    """A RowSource over ``client`` with ``caches`` for some tables (others go straight to the PS).

    Args:
        client: connected PSClient; its tables exist.
        caches: ``{table: HotEmbeddingCache}``.
    """

    def __init__(self, client: PSClient, caches: dict[str, HotEmbeddingCache]) -> None:
        self.client = CountingClient(client)
        self.traffic = self.client.traffic
        self.caches = caches
        self._slots: dict[str, torch.Tensor] = {}
        # Pending gradients of evicted rows, pushed with the step's own pushes (one fan-out,
        # not a round trip per table and eviction); an evicted row is never in the batch
        # that evicted it, so nothing reads it before that push.
        self._write_back: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def warm(self) -> None:
        """Load the static hot sets into their caches."""
        hot = {
            t: c.hot_ids for t, c in self.caches.items() if c.hot_ids is not None and len(c.hot_ids)
        }
        for table, (rows, versions) in self.client.pull_many(hot).items():
            self.caches[table].insert(hot[table], rows, versions)

    def rows(self, requests: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Rows for ``{table: distinct ids}``, from the caches where possible.

        Freshness checks of cached rows and pulls of missed rows share one round trip per
        shard: a miss is a conditional pull of a held version of -1, which is always stale.
        """
        slots = {
            t: self.caches[t].lookup(ids) if t in self.caches else _misses(ids)
            for t, ids in requests.items()
        }
        queries, kinds = [], []
        for table, ids in requests.items():
            hit = slots[table] >= 0
            if bool(hit.any()):
                cache = self.caches[table]
                held = cache.held_versions[slots[table][hit]]
                queries.append((table, ids[hit], held, cache.pull_bound))
                kinds.append((table, "check", hit.nonzero().squeeze(1)))
            if not bool(hit.all()):
                missed = (~hit).nonzero().squeeze(1)
                queries.append((table, ids[missed], torch.full((len(missed),), -1), 0))
                kinds.append((table, "miss", missed))
        replies = self.client.pull_stale_many(queries) if queries else []
        out = {t: torch.empty(len(ids), self.client.dim(t)) for t, ids in requests.items()}
        for (table, kind, where), (positions, rows, versions), query in zip(
            kinds, replies, queries
        ):
            table_slots = slots[table]
            cache = self.caches.get(table)
            if kind == "check":
                cache.refresh(table_slots[where][positions], rows, versions)
                out[table][where] = cache.weights[table_slots[where]].cpu()
                continue
            out[table][where] = rows
            if cache is not None:
                pinned = table_slots[table_slots >= 0]
                table_slots[where] = self._admit(table, cache, query[1], rows, versions, pinned)
        self._slots.update(slots)
        return out

    def apply_gradients(self, updates: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Gradients of the ids of the last :meth:`rows` call: local when cached, pushed when due."""
        pushes = {}
        for table, (ids, grads) in updates.items():
            slots = self._slots.pop(table)
            if len(slots) != len(ids):
                raise ValueError(
                    f"table {table!r}: gradients for {len(ids)} ids, last lookup had {len(slots)}"
                )
            cached = slots >= 0
            push_ids, push_grads = [ids[~cached]], [grads[~cached]]
            if bool(cached.any()):
                due_ids, due_grads = self.caches[table].accumulate(slots[cached], grads[cached])
                push_ids.append(due_ids)
                push_grads.append(due_grads)
            pushes[table] = (torch.cat(push_ids), torch.cat(push_grads))
        self.client.push_many(self._with_write_backs(pushes))

    read = rows  # evaluation reads through the caches

    def flush(self) -> None:
        """Push every cached row's unpushed updates (end of training, before a checkpoint)."""
        drained = {table: cache.drain() for table, cache in self.caches.items()}
        self.client.push_many(self._with_write_backs(drained))

    def _with_write_backs(
        self, pushes: dict[str, tuple[torch.Tensor, torch.Tensor]]
    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """``pushes`` plus the evicted rows' pending gradients (then forgotten here)."""
        for table, evicted in self._write_back.items():
            parts = ([pushes[table]] if table in pushes else []) + evicted
            pushes[table] = (torch.cat([i for i, _ in parts]), torch.cat([g for _, g in parts]))
        self._write_back = {}
        return pushes

    def hit_rate(self) -> float:
        """Hits over lookups, across all caches."""
        hits = sum(c.stats.hits for c in self.caches.values())
        total = hits + sum(c.stats.misses for c in self.caches.values())
        return hits / total if total else 0.0

    def _admit(
        self,
        table: str,
        cache: HotEmbeddingCache,
        ids: torch.Tensor,
        rows: torch.Tensor,
        versions: torch.Tensor,
        pinned: torch.Tensor,
    ) -> torch.Tensor:
        """Cache what the policy admits, evicting unpinned rows if needed; -1 for pass-through ids."""
        slots = torch.full((len(ids),), -1, dtype=torch.int64)
        admissible = cache.admissible(ids).nonzero().squeeze(1)
        shortfall = len(admissible) - cache.free_slots()
        if shortfall > 0 and cache.policy != "static":
            evicted_ids, evicted_grads = cache.evict(cache.victims(shortfall, pinned))
            if len(evicted_ids):
                self._write_back.setdefault(table, []).append((evicted_ids, evicted_grads))
        admitted = admissible[: cache.free_slots()]
        slots[admitted] = cache.insert(ids[admitted], rows[admitted], versions[admitted])
        return slots


def _misses(ids: torch.Tensor) -> torch.Tensor:
    return torch.full((len(ids),), -1, dtype=torch.int64)
