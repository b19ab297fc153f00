"""PSEmbeddingBagCollection: pooled embedding lookups whose rows live on the PS.

Forward: per table, the ids of all its features are deduplicated, the distinct
rows are fetched (from the parameter servers through a row source), and each
feature is pooled with ``embedding_bag`` (a feature with one id in every bag is a
gather of its rows). The fetched rows are autograd leaves;
after ``backward()``, :meth:`step` hands each table's row gradients (summed
over every occurrence, scaled by ``grad_scale``) back to the row source, which
pushes them to the shards where the server-side optimizer applies them.

Devices: ids are deduplicated on the host, where the shards' client routes
them; row sources take and return host tensors. The collection moves the
fetched rows and the pooling indices to its ``device`` (the model's), pools
there, and brings the row gradients back to the host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from ember.kernels.dedup import sorted_unique_inverse
from ember.trainer.data.batch import JaggedIds
from ember.trainer.timer import Timer
from ember.trainer.traffic import CountingClient
from torch import nn


class RowSource(Protocol):
    """Where tables' rows come from and where their gradients go (several tables per call).
    Every tensor in and out is a host (CPU) tensor.

    Training calls, per step: :meth:`rows` (the step's rows), optionally
    :meth:`prefetch` (the next step's ids, known early), then
    :meth:`apply_gradients` exactly once (the step's gradients, possibly none).
    Evaluation calls :meth:`read`.
    """

    def rows(self, requests: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``{table: float32 rows [len(ids), dim]}`` for ``{table: distinct ids}``."""

    def apply_gradients(self, updates: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Apply ``{table: (distinct ids, grads [len(ids), dim])}``."""

    def read(self, requests: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Rows for evaluation: as :meth:`rows`, outside the training steps."""

    @property
    def blocked_s(self) -> float:
        """Seconds the calling thread has spent blocked on the shards or on other ranks: the
        PS wait a step is exposed to (embedding work on this rank is not in it)."""


@dataclasses.dataclass
class _Lookup:
    table: str
    ids: torch.Tensor
    rows: torch.Tensor


@dataclasses.dataclass
class _Plan:
    """A batch's distinct ids per table (ascending), with the inverse index of each table's
    features, and which features have exactly one id in every bag (pooling them is a gather).
    """

    features: Sequence[JaggedIds]
    unique: dict[str, tuple[torch.Tensor, torch.Tensor]]
    one_id_bags: list[bool]

    @property
    def requests(self) -> dict[str, torch.Tensor]:
        return {table: ids for table, (ids, _) in self.unique.items()}


class PSEmbeddingBagCollection(nn.Module):
    """Pooled lookups of sparse features, one table per feature or shared.

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
        self._pending: list[_Lookup] = []
        self._members = {
            t: [f for f, name in enumerate(self.feature_tables) if name == t]
            for t in self.feature_tables
        }
        self._next: _Plan | None = None

    def prefetch(self, features: Sequence[JaggedIds]) -> None:
        """Deduplicate the next training batch's ids now, and let a source that can start
        fetching their rows (``prefetch``); the next :meth:`forward` of ``features`` uses it."""
        self._next = self._plan(features)
        prefetch = getattr(self.source, "prefetch", None)
        if prefetch is not None:
            prefetch(self._next.requests)

    def forward(self, features: Sequence[JaggedIds]) -> torch.Tensor:
        """Pooled embeddings [batch, num_features, dim]."""
        _check_batch_sizes(features)
        return torch.stack(self.lookup(features), dim=1)

    def lookup(self, features: Sequence[JaggedIds]) -> list[torch.Tensor]:
        """Each feature's pooled embeddings [its bags, dim]; features may have different
        bag counts (a feature of one-id bags gives one row per id, unpooled)."""
        plan = self._next if self._next is not None and self._next.features is features else None
        self._next = None
        plan = plan or self._plan(features)
        pooled: list[torch.Tensor | None] = [None] * len(features)
        self._pending = []
        read = self.source.rows if self.training else self.source.read
        fetched = read(plan.requests)
        for table, (ids, inverse) in plan.unique.items():
            rows = fetched[table].to(self.device).detach().requires_grad_(self.training)
            if self.training:
                self._pending.append(_Lookup(table, ids, rows))
            inverse = inverse.to(self.device)
            start = 0
            for f in self._members[table]:
                count = len(features[f].values)
                where = inverse[start : start + count]
                if plan.one_id_bags[f]:  # sum and mean of one row: the row itself
                    pooled[f] = _gather(rows, where)
                else:
                    pooled[f] = F.embedding_bag(
                        where, rows, features[f].offsets.to(self.device), mode=self.pooling,
                        include_last_offset=True,
                    )  # fmt: skip
                start += count
        return pooled

    def _plan(self, features: Sequence[JaggedIds]) -> _Plan:
        one_id_bags = _check_features(features, len(self.feature_tables))
        # Ascending distinct ids: the order in which the shards and the client's checks
        # take them without sorting again.
        unique = {
            table: sorted_unique_inverse(torch.cat([features[f].values.cpu() for f in fs]))
            for table, fs in self._members.items()
        }
        return _Plan(features, unique, one_id_bags)

    def step(self) -> None:
        """Hand the row gradients of the last training forward to the source (every step,
        even with none: sources that keep step clocks count on it); call after backward()."""
        updates = {
            lookup.table: (lookup.ids, (lookup.rows.grad * self.grad_scale).cpu())
            for lookup in self._pending
            if lookup.rows.grad is not None
        }
        self.source.apply_gradients(updates)
        self._pending = []


def _gather(rows: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """``rows[where]`` with a backward that sums each row's gradients: on the host
    index_select (cheaper than embedding_bag's), on a GPU embedding (whose backward is
    deterministic; index_select's adds atomically)."""
    return rows.index_select(0, where) if rows.device.type == "cpu" else F.embedding(where, rows)


def _check_features(features: Sequence[JaggedIds], expected: int) -> list[bool]:
    """Raise ValueError naming the first malformed feature; returns, per feature, whether
    every bag holds exactly one id."""
    if len(features) != expected:
        raise ValueError(f"expected {expected} sparse features, got {len(features)}")
    one_id_bags = []
    for f, feature in enumerate(features):
        values, offsets = feature.values, feature.offsets
        if values.dtype != torch.int64 or offsets.dtype != torch.int64:
            raise ValueError(
                f"feature {f}: ids and offsets must be int64 tensors, got {values.dtype}, {offsets.dtype}"
            )
        if values.dim() != 1 or offsets.dim() != 1 or len(offsets) < 1:
            raise ValueError(f"feature {f}: ids and offsets must be 1-D with at least one offset")
        if len(values) and int(values.min()) < 0:
            raise ValueError(f"feature {f}: ids must be >= 0, got {int(values.min())}")
        smallest_bag = feature.smallest_bag()
        if int(offsets[0]) != 0 or int(offsets[-1]) != len(values) or smallest_bag < 0:
            raise ValueError(f"feature {f}: offsets must rise from 0 to len(ids) = {len(values)}")
        one_id_bags.append(feature.one_id_per_bag(smallest_bag))
    return one_id_bags


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
