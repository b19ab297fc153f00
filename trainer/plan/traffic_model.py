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
``writeback_interval`` steps (and at the end) the writer rank writes the hot
rows stepped since the last write-back to the shards, with their optimizer
state: the hot ids drawn in that many steps of every rank; its bytes are
given per step, amortised.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from ember.trainer.cache.profiler import cache_bytes_per_row
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
        state_floats: optimizer-state floats per row (written back with a hot row).
        writeback_interval: steps between write-backs of the hot rows (the run's steps
            when it writes back only at the end).
    """

    dim: int
    batch_size: int
    ranks: int = 1
    row_bytes: int = 0
    control_bytes_per_step: float = 0.0
    state_floats: int = 0
    writeback_interval: int = 1000

    def __post_init__(self) -> None:
        if min(self.dim, self.batch_size, self.ranks, self.writeback_interval) < 1:
            raise ValueError(
                f"dim, batch_size, ranks and writeback_interval must be >= 1, got {self.dim}, "
                f"{self.batch_size}, {self.ranks}, {self.writeback_interval}"
            )
        if self.state_floats < 0:
            raise ValueError(f"state_floats must be >= 0, got {self.state_floats}")
        if not self.row_bytes:
            object.__setattr__(self, "row_bytes", 4 * self.dim)

    @property
    def writeback_row_bytes(self) -> int:
        """Bytes a written-back hot row takes: id, weights and state, version."""
        return ID_BYTES + 4 * (self.dim + self.state_floats) + ID_BYTES

    @property
    def hot_row_bytes(self) -> int:
        """Trainer memory of one hot row (what a budget is divided by)."""
        return cache_bytes_per_row(self.dim)


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
    bytes_writeback: float  # per step, amortised over the write-back interval

    @property
    def bytes_up(self) -> float:
        """Bytes from the trainer to the shards: ids asked for, and the gradients."""
        return ID_BYTES * self.cold_rows + self.bytes_pushed + self.bytes_control / 2

    @property
    def bytes_down(self) -> float:
        """Bytes from the shards to the trainer: rows, and collision rows."""
        return self.bytes_pulled - ID_BYTES * self.cold_rows + self.bytes_control / 2

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
        distinct = hot = cold = collisions = union_hot = dirty = 0.0
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
            dirty += float(
                _presence(
                    self.profiles[t].probabilities[:k],
                    self._lookups[t] * self.workload.ranks * self.workload.writeback_interval,
                ).sum()
            )
        w = self.workload
        collisions = collisions if staleness == 0 else 0.0
        row = w.row_bytes
        # With staleness 0 the update also names the next step's cold ids (control) and
        # its answer carries the collision rows with their positions.
        refresh_control = ID_BYTES * (cold + collisions) if staleness == 0 else 0.0
        allreduce = (hot_rows + 1 + 4 * w.dim * union_hot) if w.ranks > 1 else 0.0
        return Traffic(
            hot_rows=hot_rows,
            row_bytes=row,
            hit_rate=hot / distinct if distinct else 0.0,
            distinct_rows=distinct,
            cold_rows=cold,
            collision_rows=collisions,
            bytes_pulled=cold * (ID_BYTES + row) + collisions * row,
            bytes_pushed=cold * (ID_BYTES + row),
            bytes_control=w.control_bytes_per_step + refresh_control,
            bytes_hot_allreduce=allreduce,
            bytes_writeback=dirty * w.writeback_row_bytes / w.writeback_interval,
        )


def _presence(probabilities: np.ndarray, lookups: float) -> np.ndarray:
    """``1 - (1 - p)^L``: the chance each id is among ``lookups`` independent draws."""
    return -np.expm1(lookups * np.log1p(-np.minimum(probabilities, 1.0 - 1e-16)))
