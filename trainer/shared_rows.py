"""The rows two consecutive steps share, stepped by the trainer as the shard steps them.

With one rank and staleness 0, step t+1's rows are read at clock t-1 (riding on
the update of clock t-1) and miss only clock t: this rank's own update of
step t. The rows step t+1 shares with step t are the only ones clock t
changes among them, so the trainer can step its copies of those rows itself,
with the same optimizer kernel, the state the shard held at clock t-1 (read
with the rows) and step t's gradients, instead of waiting for the update's
answer to bring them (a refresh). Step t+1's rows then wait for nothing of
step t (its update still waits for update t: staleness 0 allows one in
flight).

The trainer's row equals the shard's when: the job has one rank (the clock
is this rank's update alone), rows and gradients travel as float32, step t's
update carries exactly the ids announced for step t, this job is the only
writer of those rows (as exact mode's guarantee assumes), and both sides
step rows with the native kernels of one build (the pure-torch reference
rounds differently in the last bits): the pipeline checks the first four
it can see, and steps here only when this process runs the native kernels.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from ember.kernels.loader import native_backend_for
from ember.kernels.optim import fused_row_update
from ember.ps_server.wire.table_spec import OptimizerSpec

# Per table: the shared ids, their positions among the later step's ids and among the
# earlier step's.
SharedByTable = dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def steps_like_the_shards() -> bool:
    """Whether this process steps rows with the native kernels, as the shards do."""
    return native_backend_for(torch.empty(0))


@dataclasses.dataclass
class SharedRows:
    """What step u shares with step u-1.

    Attributes:
        earlier: step u-1's ids per table, as announced (its update must carry exactly
            these for the shared rows to be stepped here).
        by_table: per table with shared ids, ``(ids, positions in u's, positions in
            u-1's)``.
    """

    earlier: dict[str, torch.Tensor]
    by_table: SharedByTable

    @classmethod
    def between(
        cls, earlier: dict[str, torch.Tensor], later: dict[str, torch.Tensor]
    ) -> SharedRows:
        """The rows of ``later`` (step u's distinct ids) that ``earlier`` (u-1's) has too."""
        shared: SharedByTable = {}
        for table, ids in later.items():
            if table not in earlier:
                continue
            common, at_later, at_earlier = np.intersect1d(
                ids.numpy(), earlier[table].numpy(), assume_unique=True, return_indices=True
            )
            if len(common):
                shared[table] = tuple(
                    torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))
                    for a in (common, at_later, at_earlier)
                )
        return cls(earlier, shared)

    @property
    def ids(self) -> dict[str, torch.Tensor]:
        """The shared ids per table: whose optimizer state to read with step u's rows."""
        return {table: ids for table, (ids, _, _) in self.by_table.items()}

    def steppable(self, updates: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> bool:
        """Whether ``updates`` (step u-1's) carry exactly the announced ids, every table and
        no other, so that the shared rows are the only ones of step u the update changes
        and stepping them here matches the shard (no gradients at all change no row: that
        holds too)."""
        if not updates:
            return True
        return updates.keys() == self.earlier.keys() and all(
            torch.equal(ids, self.earlier[table]) for table, (ids, _) in updates.items()
        )

    def step(
        self,
        rows: dict[str, torch.Tensor],
        states: dict[str, tuple[torch.Tensor, torch.Tensor]],
        updates: dict[str, tuple[torch.Tensor, torch.Tensor]],
        optimizers: dict[str, OptimizerSpec],
    ) -> None:
        """Step the shared rows of ``rows`` (step u's, read at clock u-2) in place with
        step u-1's ``updates``, from their ``states`` (versions and optimizer state at clock
        u-2): the rows at clock u-1, as the shard computes them (call only when
        :meth:`steppable`)."""
        if not updates:
            return
        groups: dict[tuple[OptimizerSpec, int], list[str]] = {}
        for table in self.by_table:  # one kernel call per optimizer and row width
            groups.setdefault((optimizers[table], rows[table].shape[1]), []).append(table)
        for (optimizer, _), tables in groups.items():
            parts = [self.by_table[table] for table in tables]
            weights = torch.cat([rows[t].index_select(0, p[1]) for t, p in zip(tables, parts)])
            grads = torch.cat(
                [updates[t][1].index_select(0, p[2]) for t, p in zip(tables, parts)]
            ).to(torch.float32)
            versions = torch.cat([states[table][0] for table in tables])
            state = torch.cat([states[table][1] for table in tables])
            slots = torch.arange(len(weights), dtype=torch.int64)
            fused_row_update(optimizer, weights, state, versions, slots, grads)
            for table, part, stepped in zip(
                tables, parts, weights.split([len(p[1]) for p in parts])
            ):
                rows[table][part[1]] = stepped
