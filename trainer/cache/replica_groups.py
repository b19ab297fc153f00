"""ReplicaGroups: a rank's replicated hot rows, one set of tensors per optimizer.

The hot rows of the tables that share an optimizer live in one weights, state,
steps and dirty tensor (table after table), so a step's hot rows of all those
tables take one optimizer call, and with several ranks their gradients are
summed with two all-reduces for all groups at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
import torch.distributed as dist
from ember.kernels.optim import fused_row_update, state_width
from ember.ps_server.wire.table_spec import OptimizerSpec, TableSpec
from ember.trainer.timer import Timer

HotGrads = dict[int, tuple[torch.Tensor, torch.Tensor]]  # group number -> (rows, grads)


class ReplicaGroup:
    """The hot rows of the tables that share one optimizer, in one set of tensors."""

    def __init__(
        self, optimizer: OptimizerSpec, dim: int, sizes: dict[str, int], device: torch.device
    ) -> None:
        self.optimizer = optimizer
        rows = sum(sizes.values())
        self.weights = torch.zeros(rows, dim, device=device)
        self.state = torch.zeros(rows, state_width(optimizer.kind, dim), device=device)
        self.steps = torch.zeros(rows, dtype=torch.int64, device=device)
        self.dirty = torch.zeros(rows, dtype=torch.bool, device=device)  # stepped since a flush
        self.start = dict(zip(sizes, itertools.accumulate([0, *list(sizes.values())[:-1]])))

    def step(self, rows: torch.Tensor, grads: torch.Tensor) -> None:
        """One optimizer step of the distinct ``rows`` in place, as the shard steps a row."""
        self.dirty[rows] = True
        fused_row_update(
            self.optimizer, self.weights, self.state, self.steps, rows, grads.contiguous()
        )


class ReplicaGroups:
    """The replicas of ``hot_ids`` (ascending, distinct), grouped by their tables' optimizer.

    Args:
        specs: ``{table: TableSpec}`` of every hot table.
        hot_ids: ``{table: ids}`` replicated.
        dim: the row width of every table.
        device: where the replicas live.
    """

    def __init__(
        self,
        specs: dict[str, TableSpec],
        hot_ids: dict[str, torch.Tensor],
        dim: int,
        device: torch.device,
    ) -> None:
        self.device = device
        self.groups: list[ReplicaGroup] = []
        self.group_of: dict[str, int] = {}  # each hot table's group number
        for optimizer in dict.fromkeys(specs[t].optimizer for t in hot_ids):
            sizes = {t: len(ids) for t, ids in hot_ids.items() if specs[t].optimizer == optimizer}
            self.group_of.update(dict.fromkeys(sizes, len(self.groups)))
            self.groups.append(ReplicaGroup(optimizer, dim, sizes, device))
        # Where each hot table's rows start in its group's tensors.
        self.key_start = {t: self.groups[g].start[t] for t, g in self.group_of.items()}
        self._sizes = {t: len(ids) for t, ids in hot_ids.items()}
        # Where each group's rows start when all hot rows are numbered in one sequence.
        sizes = [len(group.steps) for group in self.groups]
        self._base = list(itertools.accumulate([0, *sizes[:-1]]))
        self._total = sum(sizes)

    def views(self, name: str) -> dict[str, torch.Tensor]:
        """Each hot table's rows of the groups' ``name`` tensor ("weights", "state", "steps"
        or "dirty"): views, so what a step changes shows in them."""
        return {
            t: getattr(self.groups[g], name).narrow(0, self.key_start[t], self._sizes[t])
            for t, g in self.group_of.items()
        }

    def by_group(
        self,
        tables: Sequence[str],
        found_at: torch.Tensor,
        replica_rows: torch.Tensor,
        found_counts: list[int],
    ) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
        """A step's hot ids by group: (the group's number, their positions, their rows in
        the group), for the groups with any; ``found_at`` and ``replica_rows`` hold
        ``tables``' hot ids table after table, ``found_counts`` each table's count."""
        if len(self.groups) == 1:
            return [(0, found_at, replica_rows)]
        found_parts = found_at.split(found_counts)
        row_parts = replica_rows.split(found_counts)
        members: dict[int, list[int]] = {}
        for t, table in enumerate(tables):
            if found_counts[t]:
                members.setdefault(self.group_of[table], []).append(t)
        return [
            (number, torch.cat([found_parts[t] for t in ts]), torch.cat([row_parts[t] for t in ts]))
            for number, ts in members.items()
        ]

    def summed_over_ranks(
        self, hot_grads: HotGrads, flush: bool, blocked: Timer
    ) -> tuple[HotGrads, bool, int]:
        """Every rank's hot-row gradients summed, per group ``(rows, grads)``: the rows any
        rank touched, ascending; whether any rank wants to flush after this step; and the
        bytes all-reduced. Every rank calls this once per step; ``blocked`` times the waits.
        """
        touched = torch.zeros(self._total + 1, dtype=torch.uint8, device=self.device)
        for number, (rows, _) in hot_grads.items():
            touched[self._base[number] + rows] = 1
        touched[-1] = int(flush)
        with blocked:  # reading the result waits for every rank (NCCL queues it)
            dist.all_reduce(touched, op=dist.ReduceOp.MAX)
            flush = bool(touched[-1])
        union = touched[:-1].nonzero().squeeze(1)  # hot-row numbers over all groups, ascending
        parts = {}
        for number, (group, base) in enumerate(zip(self.groups, self._base)):
            inside = (union >= base) & (union < base + len(group.steps))
            rows = union[inside] - base
            sums = torch.zeros(len(rows), group.weights.shape[1], device=self.device)
            if number in hot_grads:
                mine, grads = hot_grads[number]  # distinct rows, all in the union
                sums[torch.searchsorted(rows, mine)] = grads
            parts[number] = (rows, sums)
        flat = torch.cat([sums.reshape(-1) for _, sums in parts.values()])
        with blocked:
            dist.all_reduce(flat)
            if flat.is_cuda:  # queued, not done: wait here, where it counts as PS wait
                torch.cuda.current_stream(flat.device).synchronize()
        summed, start = {}, 0
        for number, (rows, sums) in parts.items():
            summed[number] = (rows, flat[start : start + sums.numel()].view_as(sums))
            start += sums.numel()
        return summed, flush, touched.numel() + 4 * flat.numel()

    def step(self, hot_grads: HotGrads) -> None:
        """One optimizer step of each group's touched rows."""
        for number, (rows, grads) in hot_grads.items():
            if len(rows):
                self.groups[number].step(rows, grads)
