"""PSEmbeddingBagCollection: pooled embedding lookups whose rows live on the PS.

Forward: the ids of every feature are deduplicated per table in one native
call, the distinct rows are fetched (from the parameter servers through a row
source), and all tables' rows become one tensor, as in a table-batched
embedding: a batch whose every bag holds one id is pooled by one gather, any
other by one embedding_bag over all features. That tensor is the autograd leaf;
after ``backward()``, :meth:`step` hands each table's row gradients (summed
over every occurrence, scaled by ``grad_scale``) back to the row source, which
pushes them to the shards where the server-side optimizer applies them.

Devices: ids are deduplicated on the host, where the shards' client routes
them; row sources take host tensors and return rows on the host or already on
the collection's ``device`` (the model's). The collection moves the rows and
the pooling indices there, pools there, and brings the row gradients back to
the host.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from ember.kernels.dedup import plan_features
from ember.trainer.data.batch import JaggedIds
from ember.trainer.lookahead import take_planned
from ember.trainer.timer import Timer
from ember.trainer.traffic import CountingClient
from torch import nn


class RowSource(Protocol):
    """Where tables' rows come from and where their gradients go (several tables per call).
    Every tensor in is a host (CPU) tensor; rows come out on the host, or on the
    collection's device from a source that keeps or stages rows there (hot replicas on a
    GPU, rows prefetched to it).

    Training calls, per step: :meth:`rows` (the step's rows), optionally
    :meth:`prefetch` (later steps' ids, known early: each step's once, in step order,
    at most ``lookahead`` steps past the current one where a source has that attribute,
    else 1), then :meth:`apply_gradients` exactly once (the step's gradients, possibly
    none). Evaluation calls :meth:`read`. ``prefetch`` of the clocked sources (the step
    pipeline, the replicas in front of it) may run on a planning thread, never at the same
    time as the source's other calls (:mod:`ember.trainer.lookahead`): it must not wait on
    the shards, time :attr:`blocked_s` or touch a GPU.
    """

    def rows(self, requests: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``{table: float32 rows [len(ids), dim]}`` for ``{table: distinct ids}``."""

    def apply_gradients(self, updates: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Apply ``{table: (distinct ids, grads [len(ids), dim])}``: every table of the last
        :meth:`rows` call with those ids, in its order, or none."""

    def read(self, requests: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Rows for evaluation: as :meth:`rows`, outside the training steps."""

    @property
    def blocked_s(self) -> float:
        """Seconds the calling thread has spent blocked on the shards or on other ranks: the
        PS wait a step is exposed to (embedding work on this rank is not in it)."""


# Plans kept for batches announced ahead, past any pipeline's lookahead (1 + its staleness,
# at most 65): beyond this the oldest is dropped, and planned again at its step.
MAX_PLANNED = 128


@dataclasses.dataclass
class _Plan:
    """A batch's distinct ids per table (ascending, tables in the collection's order), each
    id's row among all tables' distinct ids (``inverse``, feature by feature), and whether
    every feature has exactly one id in every bag (pooling them is one gather)."""

    features: Sequence[JaggedIds]
    offsets: list[torch.Tensor]  # each feature's offsets, on the host
    requests: dict[str, torch.Tensor]
    inverse: torch.Tensor
    one_id_bags: bool


@dataclasses.dataclass
class _Lookup:
    """A training forward's rows, for :meth:`PSEmbeddingBagCollection.step`: every table's
    rows in one leaf tensor, table after table."""

    requests: dict[str, torch.Tensor]
    rows: torch.Tensor


class PSEmbeddingBagCollection(nn.Module):
    """Pooled lookups of sparse features, one table per feature or shared.

    All tables' rows of a step are one tensor (as in a table-batched embedding): one
    gather pools every feature, one backward gives every row's gradient. The tables of a
    collection therefore share one row width.

    Args:
        source: the row source (a :class:`PSRowSource` or a cache in front of one).
        feature_tables: table name of each feature, in feature order.
        pooling: "sum" or "mean".
        grad_scale: factor applied to row gradients before they leave (1 / world
            size under DDP, so sparse and dense gradients are averaged alike).
        device: where rows are pooled and the output lives (the model's device).

    Example:
        >>> ebc = PSEmbeddingBagCollection(source, ["user", "item", "item"])   # doctest: +SKIP
        >>> pooled = ebc(batch.sparse)       # [batch, 3, dim]               # doctest: +SKIP
        >>> loss.backward(); ebc.step()                                     # doctest: +SKIP
    """

    def __init__(
        self,
        source: RowSource,
        feature_tables: Sequence[str],
        pooling: str = "sum",
        grad_scale: float = 1.0,
        device: str | torch.device = "cpu",
    ) -> None:
        super().__init__()
        if pooling not in ("sum", "mean"):
            raise ValueError(f"pooling must be 'sum' or 'mean', got {pooling!r}")
        if not feature_tables:
            raise ValueError("feature_tables must name at least one table")
        self.source = source
        self.feature_tables = list(feature_tables)
        self.pooling = pooling
        self.grad_scale = grad_scale
        self.device = torch.device(device)
        self._pending: _Lookup | None = None
        self._tables = list(dict.fromkeys(self.feature_tables))  # first-use order
        number = {table: t for t, table in enumerate(self._tables)}
        self._table_of = [number[table] for table in self.feature_tables]
        # Plans of the next training batches, oldest first (see prefetch).
        self._planned: collections.deque[_Plan] = collections.deque(maxlen=MAX_PLANNED)

    def prefetch(self, features: Sequence[JaggedIds]) -> None:
        """Deduplicate a later training batch's ids now (batches in step order, each once),
        and let a source that can start fetching their rows (``prefetch``); the
        :meth:`forward` of ``features`` (the same object) uses it."""
        self._planned.append(self._plan(features))
        prefetch = getattr(self.source, "prefetch", None)
        if prefetch is not None:
            prefetch(self._planned[-1].requests)

    def forward(self, features: Sequence[JaggedIds]) -> torch.Tensor:
        """Pooled embeddings [batch, num_features, dim]."""
        _check_batch_sizes(features)
        plan, rows = self._rows(features)
        if not plan.one_id_bags:
            return torch.stack(self._pooled(plan, rows), dim=1)
        # Sample by sample, feature by feature: the gather fills [batch, features, dim].
        batch = features[0].batch_size
        where = plan.inverse.view(len(features), batch).t().reshape(-1).to(self.device)
        return _gather(rows, where).view(batch, len(features), rows.shape[1])

    def lookup(self, features: Sequence[JaggedIds]) -> list[torch.Tensor]:
        """Each feature's pooled embeddings [its bags, dim]; features may have different
        bag counts (a feature of one-id bags gives one row per id, unpooled)."""
        return self._pooled(*self._rows(features))

    def _rows(self, features: Sequence[JaggedIds]) -> tuple[_Plan, torch.Tensor]:
        """The plan of ``features`` (prefetched or made now) and their rows, all tables' in
        one tensor on the device (a leaf that takes gradients when training)."""
        plan = take_planned(self._planned, lambda p: p.features is features)
        plan = plan or self._plan(features)
        read = self.source.rows if self.training else self.source.read
        fetched = read(plan.requests)
        parts = [fetched[table] for table in plan.requests]
        for part, (table, ids) in zip(parts, plan.requests.items()):
            # One tensor for all tables: a short answer would shift every later table's rows.
            if part.dim() != 2 or len(part) != len(ids):
                raise ValueError(
                    f"the row source answered {tuple(part.shape)} rows for the {len(ids)} ids "
                    f"of table {table!r}"
                )
        widths = {part.shape[1] for part in parts}
        if len(widths) > 1:
            raise ValueError(
                f"the tables of one collection must share a row width, got {sorted(widths)}: "
                "use one collection per width"
            )
        rows = (torch.cat(parts) if len(parts) > 1 else parts[0]).to(self.device)
        rows = rows.detach().requires_grad_(self.training)
        self._pending = _Lookup(plan.requests, rows) if self.training else None
        return plan, rows

    def _pooled(self, plan: _Plan, rows: torch.Tensor) -> list[torch.Tensor]:
        """Each feature's pooled rows, from one gather (one-id bags) or one embedding_bag."""
        inverse = plan.inverse.to(self.device)
        if plan.one_id_bags:  # sum and mean of one row: the row itself
            return list(_gather(rows, inverse).split([len(f.values) for f in plan.features]))
        # Every feature's bags, one after another, with offsets into the ids of all features.
        starts = itertools.accumulate([0, *(len(f.values) for f in plan.features[:-1])])
        offsets = torch.cat(
            [bounds[:-1] + start for bounds, start in zip(plan.offsets, starts)]
            + [torch.tensor([len(inverse)])]
        )
        pooled = F.embedding_bag(
            inverse, rows, offsets.to(self.device), mode=self.pooling, include_last_offset=True
        )
        return list(pooled.split([f.batch_size for f in plan.features]))

    def _plan(self, features: Sequence[JaggedIds]) -> _Plan:
        if len(features) != len(self.feature_tables):
            raise ValueError(
                f"expected {len(self.feature_tables)} sparse features, got {len(features)}"
            )
        # Ascending distinct ids: the order in which the shards and the client's checks
        # take them without sorting again.
        offsets = [f.offsets.cpu() for f in features]
        unique, inverse, one_id_bags = plan_features(
            [f.values for f in features], offsets, self._table_of, len(self._tables)
        )
        return _Plan(features, offsets, dict(zip(self._tables, unique)), inverse, all(one_id_bags))

    def step(self) -> None:
        """Hand the row gradients of the last training forward to the source (every step,
        even with none: sources that keep step clocks count on it); call after backward().

        Every row the forward looked up takes a gradient, zero where the loss did not use
        its feature (one backward covers all tables, as in a table-batched embedding)."""
        pending, self._pending = self._pending, None
        updates = {}
        if pending is not None and pending.rows.grad is not None:
            grads = pending.rows.grad
            if self.grad_scale != 1.0:
                grads = grads * self.grad_scale
            sizes = [len(ids) for ids in pending.requests.values()]
            for (table, ids), part in zip(pending.requests.items(), grads.cpu().split(sizes)):
                updates[table] = (ids, part)
        self.source.apply_gradients(updates)


def _gather(rows: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """``rows[where]`` with a backward that sums each row's gradients: on the host
    index_select (cheaper than embedding_bag's), on a GPU embedding (whose backward is
    deterministic; index_select's adds atomically)."""
    return rows.index_select(0, where) if rows.device.type == "cpu" else F.embedding(where, rows)


def _check_batch_sizes(features: Sequence[JaggedIds]) -> None:
    for f, feature in enumerate(features):
        if feature.batch_size != features[0].batch_size:
            raise ValueError(
                f"feature {f} has {feature.batch_size} samples, feature 0 has "
                f"{features[0].batch_size}"
            )


class PSRowSource:
    """Rows straight from the parameter servers: pull on lookup, push on update.

    Args:
        client: a connected PSClient whose tables already exist.
    """

    def __init__(self, client: Any) -> None:
        self.client = CountingClient(client)
        self.traffic = self.client.traffic
        self._blocked = Timer()

    @property
    def blocked_s(self) -> float:
        """Seconds spent in calls to the shards (every call here is one)."""
        return self._blocked.seconds

    def rows(self, requests: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        with self._blocked:
            pulled = self.client.pull_many(requests)
        return {table: rows for table, (rows, _) in pulled.items()}

    def apply_gradients(self, updates: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        with self._blocked:
            self.client.push_many(updates)

    read = rows
