"""What a hot set does to a step's traffic, predicted from the id law without simulating.

With ``L`` lookups of a table per step and independent draws, id i is among a
step's distinct ids with probability ``d_i = 1 - (1 - p_i)^L``; the expected
distinct ids are ``sum d_i``. Ids in the hot set are served by the replicas;
the rest are the cold rows a step pulls, and pushes back as gradients. With
staleness 0, the next step's cold rows that this step updated (the collision
rows, ``sum d_i^2`` for independent steps) come back with the update. With
several ranks, the hot rows any rank touched (``d_i`` with ``W L`` lookups)
have their gradients all-reduced. The hit rate is counted as the trainer
counts it: the share of a step's distinct rows that are hot. Every
``flush_every`` steps and at the end, the writer rank writes the hot rows
stepped since the last write-back to the shards, with their optimizer state:
the hot ids any rank drew in those steps; rows and bytes are given per step,
amortised over the run.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

import numpy as np
from ember.trainer.cache.profiler import replica_bytes_per_row
from ember.trainer.plan.profile import TableProfile

ID_BYTES = 8


@dataclasses.dataclass(frozen=True)
class Workload:
    """The training run a plan is for.

    Attributes:
        dim: embedding width (every table).
        batch_size: samples per step and rank.
        ranks: trainer ranks.
        row_bytes: bytes of a row (or gradient row) on the wire (4 * dim for float32).
        control_bytes_per_step: step messages' bytes beyond ids and rows (clocks, names,
            framing), measured by a calibration run (or 0).
        state_floats: optimizer-state floats per row (held and written back with a hot
            row).
        steps: the run's steps.
        flush_every: steps between write-backs of the hot rows (0: at the end only).
    """

    dim: int
    batch_size: int
    ranks: int = 1
    row_bytes: int = 0
    control_bytes_per_step: float = 0.0
    state_floats: int = 0
    steps: int = 1000
    flush_every: int = 0

    def __post_init__(self) -> None:
        if min(self.dim, self.batch_size, self.ranks, self.steps) < 1:
            raise ValueError(
                f"dim, batch_size, ranks and steps must be >= 1, got {self.dim}, "
                f"{self.batch_size}, {self.ranks}, {self.steps}"
            )
        if self.state_floats < 0 or self.flush_every < 0:
            raise ValueError(
                f"state_floats and flush_every must be >= 0, got {self.state_floats}, "
                f"{self.flush_every}"
            )
        if not self.row_bytes:
            object.__setattr__(self, "row_bytes", 4 * self.dim)

    @property
    def writeback_row_bytes(self) -> int:
        """Bytes a written-back hot row takes: id, weights and state, version."""
        return ID_BYTES + 4 * (self.dim + self.state_floats) + ID_BYTES

    @property
    def hot_row_bytes(self) -> int:
        """Trainer memory of one replicated hot row (what a budget is divided by)."""
        return replica_bytes_per_row(self.dim, self.state_floats)

    @property
    def writeback_intervals(self) -> list[int]:
        """The steps each write-back of a run covers (the last may be shorter)."""
        every = self.flush_every or self.steps
        full, rest = divmod(self.steps, every)
        return [every] * full + ([rest] if rest else [])


@dataclasses.dataclass(frozen=True)
class Traffic:
    """A step's expected rows and bytes on one rank (bytes per step, by the categories the
    trainer reports)."""

    hot_rows: int
    row_bytes: int
    hit_rate: float
    distinct_rows: float
    cold_rows: float
    collision_rows: float
    bytes_pulled: float
    bytes_pushed: float
    bytes_control: float
    bytes_hot_allreduce: float
    bytes_up: float  # to the shards: ids asked for, gradients, refresh ids, framing
    bytes_down: float  # from the shards: rows, collision rows and their positions, framing
    writeback_rows: float  # hot rows written back, per step (amortised over the run)
    bytes_writeback: float  # their bytes, per step

    def per_sample(self, batch_size: int) -> dict[str, float]:
        """Bytes per sample by category."""
        return {
            "pulled": self.bytes_pulled / batch_size,
            "pushed": self.bytes_pushed / batch_size,
            "hot_allreduce": self.bytes_hot_allreduce / batch_size,
            "control": self.bytes_control / batch_size,
        }


class TrafficModel:
    """Expected traffic of any hot set taken in profile order from ``profiles``.

    The hot set of ``k`` rows is the first ``k`` profiled ids over all tables by rank key:
    for a counted profile, what the trainer's profiler picks from the same sample (the
    most counted); for a law, its most probable ids (an oracle hot set).

    Example:
        >>> from ember.trainer.plan.profile import zipf_profile
        >>> model = TrafficModel([zipf_profile("t", 1000, 1.2)], Workload(dim=8, batch_size=64))
        >>> traffic = model.traffic(hot_rows=50, staleness=1)
        >>> bool(0 < traffic.cold_rows < traffic.distinct_rows <= 64)
        True
    """

    def __init__(self, profiles: Sequence[TableProfile], workload: Workload) -> None:
        if not profiles:
            raise ValueError("a traffic model needs at least one table profile")
        for profile in profiles:
            profile.validate()
        self.profiles, self.workload = list(profiles), workload
        lookups = [p.lookups_per_sample * workload.batch_size for p in profiles]
        self._lookups = lookups
        self._presence = [_presence(p.probabilities, n) for p, n in zip(profiles, lookups)]
        self._all_ranks = [
            _presence(p.probabilities, n * workload.ranks) for p, n in zip(profiles, lookups)
        ]
        unseen = [
            (p.unseen_ids, _presence(np.array([p.unseen_probability]), n)[0])
            for p, n in zip(profiles, lookups)
        ]
        unseen_all_ranks = [
            _presence(np.array([p.unseen_probability]), n * workload.ranks)[0]
            for p, n in zip(profiles, lookups)
        ]
        self._unseen = [count * d for count, d in unseen]
        self._unseen_collisions = [
            count * d * d_all for (count, d), d_all in zip(unseen, unseen_all_ranks)
        ]
        self._cumulative = [np.concatenate([[0.0], np.cumsum(d)]) for d in self._presence]
        # A row of the next step is a collision when any rank's step updated it.
        self._cumulative_collisions = [
            np.concatenate([[0.0], np.cumsum(d * d_all)])
            for d, d_all in zip(self._presence, self._all_ranks)
        ]
        order = np.concatenate([p.rank_key for p in profiles])
        owners = np.concatenate([np.full(len(p.probabilities), t) for t, p in enumerate(profiles)])
        self._owners_by_rank = owners[np.argsort(-order, kind="stable")]

    @property
    def profiled_rows(self) -> int:
        """Ids a hot set can take (every id the profile knows)."""
        return len(self._owners_by_rank)

    def rows_for_budget(self, budget_bytes: float) -> int:
        """Hot rows a trainer memory budget holds (capped at the profiled ids)."""
        return min(self.profiled_rows, int(budget_bytes // self.workload.hot_row_bytes))

    def traffic(self, hot_rows: int, staleness: int) -> Traffic:
        """A step's expected traffic with the ``hot_rows`` most probable ids replicated."""
        if not 0 <= hot_rows <= self.profiled_rows:
            raise ValueError(f"hot_rows must be in 0..{self.profiled_rows}, got {hot_rows}")
        per_table = np.bincount(self._owners_by_rank[:hot_rows], minlength=len(self.profiles))
        distinct = hot = cold = collisions = union_hot = 0.0
        for t, k in enumerate(per_table):
            table_distinct = self._cumulative[t][-1] + self._unseen[t]
            table_hot = self._cumulative[t][k]
            distinct += table_distinct
            hot += table_hot
            cold += table_distinct - table_hot
            collisions += (
                self._cumulative_collisions[t][-1]
                - self._cumulative_collisions[t][k]
                + self._unseen_collisions[t]
            )
            union_hot += float(self._all_ranks[t][:k].sum())
        w = self.workload
        collisions = collisions if staleness == 0 else 0.0
        row = w.row_bytes
        # With staleness 0 the update also names the next step's cold ids (up) and its
        # answer carries the collision rows with their positions (down); both are control.
        refresh_ids = ID_BYTES * cold if staleness == 0 else 0.0
        positions = ID_BYTES * collisions
        allreduce = (hot_rows + 1 + 4 * w.dim * union_hot) if w.ranks > 1 else 0.0
        writeback_rows = self._written_back(per_table) / w.steps
        return Traffic(
            hot_rows=hot_rows,
            row_bytes=row,
            hit_rate=hot / distinct if distinct else 0.0,
            distinct_rows=distinct,
            cold_rows=cold,
            collision_rows=collisions,
            bytes_pulled=cold * (ID_BYTES + row) + collisions * row,
            bytes_pushed=cold * (ID_BYTES + row),
            bytes_control=w.control_bytes_per_step + refresh_ids + positions,
            bytes_hot_allreduce=allreduce,
            bytes_up=cold * (2 * ID_BYTES + row) + refresh_ids + w.control_bytes_per_step / 2,
            bytes_down=(cold + collisions) * row + positions + w.control_bytes_per_step / 2,
            writeback_rows=writeback_rows,
            bytes_writeback=writeback_rows * w.writeback_row_bytes,
        )

    def _written_back(self, hot_per_table: np.ndarray) -> float:
        """Hot rows a run writes back: per write-back, those any rank drew since the last."""
        w, rows = self.workload, 0.0
        for steps, times in collections.Counter(w.writeback_intervals).items():
            for t, k in enumerate(hot_per_table):
                lookups = self._lookups[t] * w.ranks * steps
                drawn = float(_presence(self.profiles[t].probabilities[:k], lookups).sum())
                rows += times * drawn
        return rows


def _presence(probabilities: np.ndarray, lookups: float) -> np.ndarray:
    """``1 - (1 - p)^L``: the chance each id is among ``lookups`` independent draws."""
    return -np.expm1(lookups * np.log1p(-np.minimum(probabilities, 1.0 - 1e-16)))
