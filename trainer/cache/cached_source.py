"""CachedRowSource: rows from HotEmbeddingCaches in front of the parameter servers.

Per lookup: cached rows whose shard version is more than ``pull_bound`` ahead
are refreshed (a conditional pull: 16 bytes per row unless stale); misses are
pulled in the same round trip, then admitted by the policy (evicting, with
write-back, what the batch does not use) or passed through uncached. Per update: cached rows take the
gradient locally and push it when due; uncached rows push at once. All shard
traffic for all tables of a step goes out in one concurrent fan-out per kind.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses

import torch
from ember.ps_server.client.ps_client import PSClient
from ember.trainer.cache.hot_cache import HotEmbeddingCache
from ember.trainer.pipeline import same_requests
from ember.trainer.timer import Timer
from ember.trainer.traffic import CountingClient


class CachedRowSource:
    """A RowSource over ``client`` with ``caches`` for some tables (others go straight to the PS).

    Args:
        client: connected PSClient; its tables exist.
        caches: ``{table: HotEmbeddingCache}``.
    """

    def __init__(
        self, client: PSClient, caches: dict[str, HotEmbeddingCache], overlap: bool = False
    ) -> None:
        self.client = CountingClient(client)
        self.overlap = overlap
        self.traffic = self.client.traffic
        self.caches = caches
        self._slots: dict[str, torch.Tensor] = {}
        # Pending gradients of evicted rows, pushed with the step's own pushes (one fan-out,
        # not a round trip per table and eviction); an evicted row is never in the batch
        # that evicted it, so nothing reads it before that push.
        self._write_back: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._requests: dict[str, torch.Tensor] = {}  # the ids of the last rows() call
        self._next: _Planned | None = None
        # One thread: a step's early pulls, then its push, then the checks behind that push.
        self._background = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="ember-cache"
        )
        self._blocked = Timer()

    @property
    def blocked_s(self) -> float:
        """Seconds the calling thread waited for pulls and pushes (see RowSource)."""
        return self._blocked.seconds

    def warm(self) -> None:
        """Load the static hot sets into their caches."""
        hot = {
            t: c.hot_ids for t, c in self.caches.items() if c.hot_ids is not None and len(c.hot_ids)
        }
        with self._blocked:
            pulled = self.client.pull_many(hot)
        for table, (rows, versions) in pulled.items():
            self.caches[table].insert(hot[table], rows, versions)

    def prefetch(self, requests: dict[str, torch.Tensor]) -> None:
        """Plan the next step's rows while this step computes (only with ``overlap``).

        Misses that this step will not push are pulled now, in the background. Freshness
        checks of cached rows, and misses this step pushes (pass-through ids and evicted rows'
        write-backs), wait for this step's push and ride behind it (:meth:`apply_gradients`),
        so they read what the serial path would.
        """
        if not self.overlap:
            return
        self._settle(self._next)
        self._next = None
        slots = self._lookup_slots(requests)
        queries = self._queries(requests, slots)
        early = _pull_early(queries, self._pushed_this_step())
        pulls = [_subset(q.pull, m) for q, m in zip(queries, early) if bool(m.any())]
        self._next = _Planned(
            requests, slots, queries, early, self._background.submit(self._pull, pulls)
        )

    def rows(self, requests: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Rows for ``{table: distinct ids}``, from the caches where possible.

        Freshness checks of cached rows and pulls of missed rows share one round trip per
        shard: a miss is a conditional pull of a held version of -1, which is always stale.
        A step planned by :meth:`prefetch` waits only for what is still in flight.
        """
        planned, self._next = self._next, None
        if planned is not None and same_requests(planned.requests, requests):
            with self._blocked:
                early, late = planned.early_replies.result(), self._late_replies(planned)
            return self._resolve(
                requests, planned.slots, planned.queries, planned.merged(early, late)
            )
        self._settle(planned)
        slots = self._lookup_slots(requests)
        queries = self._queries(requests, slots)
        with self._blocked:
            replies = self._pull([q.pull for q in queries])
        return self._resolve(requests, slots, queries, replies)

    def _lookup_slots(self, requests: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {
            t: self.caches[t].lookup(ids) if t in self.caches else _misses(ids)
            for t, ids in requests.items()
        }

    def _queries(
        self, requests: dict[str, torch.Tensor], slots: dict[str, torch.Tensor]
    ) -> list[_Query]:
        """A check of the cached ids and a pull of the missed ids, per table."""
        queries = []
        for table, ids in requests.items():
            hit = slots[table] >= 0
            if bool(hit.any()):
                cache = self.caches[table]
                held = cache.held_versions[slots[table][hit]]
                where = hit.nonzero().squeeze(1)
                queries.append(
                    _Query(table, "check", where, (table, ids[hit], held, cache.pull_bound))
                )
            if not bool(hit.all()):
                missed = (~hit).nonzero().squeeze(1)
                held = torch.full((len(missed),), -1)
                queries.append(_Query(table, "miss", missed, (table, ids[missed], held, 0)))
        return queries

    def _resolve(
        self,
        requests: dict[str, torch.Tensor],
        slots: dict[str, torch.Tensor],
        queries: list[_Query],
        replies: list[Reply],
    ) -> dict[str, torch.Tensor]:
        """Refresh the checked rows, admit the missed ones, and assemble each table's rows."""
        out = {t: torch.empty(len(ids), self.client.dim(t)) for t, ids in requests.items()}
        for query, (positions, rows, versions) in zip(queries, replies):
            table, where = query.table, query.where
            table_slots = slots[table]
            cache = self.caches.get(table)
            if query.kind == "check":
                cache.refresh(table_slots[where][positions], rows, versions)
                out[table][where] = cache.weights[table_slots[where]].cpu()
                continue
            out[table][where] = rows
            if cache is not None:
                pinned = table_slots[table_slots >= 0]
                table_slots[where] = self._admit(
                    table, cache, query.pull[1], rows, versions, pinned
                )
        self._slots.update(slots)
        self._requests = requests
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
        pushes = self._with_write_backs(pushes)
        if self._next is None:
            with self._blocked:
                self.client.push_many(pushes)
            return
        if self._next.behind_push is not None:  # a second push before the planned step
            with self._blocked:
                self._next.behind_push.result()
        late = self._next.late_pulls()
        self._next.behind_push = self._background.submit(self._push_then_pull, pushes, late)

    def _late_replies(self, planned: _Planned) -> list[Reply]:
        """The replies of a plan's late queries: sent behind the previous step's push, or now
        if that step pushed nothing (no :meth:`apply_gradients` since the plan)."""
        if planned.behind_push is not None:
            return planned.behind_push.result()
        return self._pull(planned.late_pulls())

    def _pull(self, pulls) -> list[Reply]:
        return self.client.pull_stale_many(pulls) if pulls else []

    def _push_then_pull(self, pushes, pulls) -> list[Reply]:
        self.client.push_many(pushes)
        return self._pull(pulls)

    def _pushed_this_step(self) -> dict[str, torch.Tensor]:
        """Per table, the uncached ids that this step's :meth:`apply_gradients` pushes: its
        pass-through ids and the rows its admissions evicted."""
        pushed = {}
        for table, ids in self._requests.items():
            slots = self._slots.get(table)  # gone once the step has pushed
            passed = [ids[slots < 0]] if slots is not None else []
            parts = passed + [i for i, _ in self._write_back.get(table, [])]
            if parts:
                pushed[table] = torch.cat(parts)
        return pushed

    def _settle(self, planned: _Planned | None) -> None:
        """Wait for a plan's background work (its push must land even if it is not used); on
        the training thread only, where the wait counts as blocked."""
        if planned is not None:
            with self._blocked:
                planned.early_replies.result()
                if planned.behind_push is not None:
                    planned.behind_push.result()

    read = rows  # evaluation reads through the caches

    def flush(self) -> None:
        """Push every cached row's unpushed updates (end of training, before a checkpoint)."""
        self._settle(self._next)
        self._next = None
        drained = self._with_write_backs({t: cache.drain() for t, cache in self.caches.items()})
        with self._blocked:
            self.client.push_many(drained)

    def _with_write_backs(
        self, pushes: dict[str, tuple[torch.Tensor, torch.Tensor]]
    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """``pushes`` plus the evicted rows' pending gradients (then forgotten here)."""
        for table, evicted in self._write_back.items():
            parts = ([pushes[table]] if table in pushes else []) + evicted
            pushes[table] = (torch.cat([i for i, _ in parts]), torch.cat([g for _, g in parts]))
        self._write_back = {}
        return pushes

    def close(self) -> None:
        """Stop the background thread (after :meth:`flush`)."""
        self._background.shutdown(wait=True)

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


@dataclasses.dataclass(eq=False)
class _Query:
    """One conditional pull of a table's ids: a freshness ``check`` of cached rows or a
    ``miss``; ``where`` are their positions in the step's ids, ``pull`` the request."""

    table: str
    kind: str
    where: torch.Tensor
    pull: tuple[str, torch.Tensor, torch.Tensor, int]


Reply = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # positions, rows, versions


@dataclasses.dataclass(eq=False)
class _Planned:
    """A step planned ahead: its slots and queries, which ids of each query are pulled early,
    the early pulls' future and, once the previous step pushed, the future of the late pulls
    sent behind that push."""

    requests: dict[str, torch.Tensor]
    slots: dict[str, torch.Tensor]
    queries: list[_Query]
    early: list[torch.Tensor]  # per query, a mask of its ids pulled early
    early_replies: concurrent.futures.Future
    behind_push: concurrent.futures.Future | None = None

    def late_pulls(self) -> list[tuple[str, torch.Tensor, torch.Tensor, int]]:
        """The pulls of the ids that wait for the previous step's push."""
        return [_subset(q.pull, ~m) for q, m in zip(self.queries, self.early) if not bool(m.all())]

    def merged(self, early: list[Reply], late: list[Reply]) -> list[Reply]:
        """One reply per query from the early and late replies of its parts."""
        early_replies, late_replies = iter(early), iter(late)
        replies = []
        for mask in self.early:
            if not bool(mask.any()):
                replies.append(next(late_replies))
            elif bool(mask.all()):
                replies.append(next(early_replies))
            else:  # a miss split in two: a miss's reply holds every id (held -1 is stale)
                parts = (next(early_replies), next(late_replies))
                if sum(len(p[0]) for p in parts) != len(mask):
                    raise RuntimeError("a shard left out missed rows of a conditional pull")
                rows = torch.empty(len(mask), parts[0][1].shape[1])
                versions = torch.empty(len(mask), dtype=torch.int64)
                for where, (_, part_rows, part_versions) in zip((mask, ~mask), parts):
                    rows[where], versions[where] = part_rows, part_versions
                replies.append((torch.arange(len(mask)), rows, versions))
        return replies


def _pull_early(queries: list[_Query], pushed: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Per query, which ids can be pulled at once: misses of ids that the current step does
    not push. Checks, and misses of ids it pushes, must wait for that push."""
    masks = []
    for query in queries:
        ids = query.pull[1]
        if query.kind == "check":
            masks.append(torch.zeros(len(ids), dtype=torch.bool))
        else:
            masks.append(~torch.isin(ids, pushed.get(query.table, ids[:0])))
    return masks


def _subset(
    pull: tuple[str, torch.Tensor, torch.Tensor, int], mask: torch.Tensor
) -> tuple[str, torch.Tensor, torch.Tensor, int]:
    table, ids, held, bound = pull
    return table, ids[mask], held[mask], bound


def _misses(ids: torch.Tensor) -> torch.Tensor:
    return torch.full((len(ids),), -1, dtype=torch.int64)
