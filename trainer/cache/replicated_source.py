"""ReplicatedRowSource: the static hot set replicated on every rank (FAE, OpenEmbedding).

Hot rows live on every rank and are trained like dense parameters: each step
the ranks all-reduce their hot-row gradients and apply the table's optimizer
(the shard's own update rule) to every touched row, so replicas stay identical
and exact, with no staleness. Only cold rows go through the parameter servers
each step.

The replicas take the rows over from the shards: ``warm()`` reads each hot
row's weights, optimizer state and version (its update count, Adam's step),
and ``flush()`` writes them back with versions that count the steps taken, so
the shards continue exactly where the replicas stopped.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from ember.kernels.optim import apply_rows, state_width
from ember.kernels.rows import scatter_add_rows
from ember.ps_server.client import PSClient
from ember.ps_server.table_spec import TableSpec
from ember.trainer.traffic import CountingClient


class ReplicatedRowSource:
    """A RowSource with ``hot_ids`` replicated on this rank (identical on every rank).

    Args:
        client: connected PSClient; its tables exist.
        specs: ``{table: TableSpec}`` of every table looked up.
        hot_ids: ``{table: ids}`` replicated on every rank; the same on all ranks.
        writer: whether this rank writes the hot rows back on ``flush()`` (one rank does).
        device: where the replicas live and their gradients are all-reduced (NCCL needs
            the GPU).
    """

    def __init__(
        self,
        client: PSClient,
        specs: dict[str, TableSpec],
        hot_ids: dict[str, torch.Tensor],
        writer: bool,
        device: str | torch.device = "cpu",
    ) -> None:
        self.client = CountingClient(client)
        self.traffic = self.client.traffic
        self.specs = specs
        self.device = torch.device(device)
        self.hot_ids = {
            t: torch.sort(torch.as_tensor(ids, dtype=torch.int64)).values
            for t, ids in hot_ids.items()
        }
        self.writer = writer
        self.weights = {
            t: torch.zeros(len(ids), specs[t].dim, device=self.device)
            for t, ids in self.hot_ids.items()
        }
        self.state = {
            t: torch.zeros(
                len(ids), state_width(specs[t].optimizer.kind, specs[t].dim), device=self.device
            )
            for t, ids in self.hot_ids.items()
        }
        self.steps = {
            t: torch.zeros(len(ids), dtype=torch.int64, device=self.device)
            for t, ids in self.hot_ids.items()
        }
        self.hits = self.lookups = 0
        self._positions: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def hit_rate(self) -> float:
        """Lookups served by replicated rows over all lookups."""
        return self.hits / self.lookups if self.lookups else 0.0

    def warm(self) -> None:
        """Take the hot rows over: their weights, optimizer state and versions."""
        for table, ids in self.hot_ids.items():
            if len(ids):
                rows, state, versions = self.client.pull_with_state(table, ids)
                self.weights[table] = rows.to(self.device)
                self.state[table] = state.to(self.device)
                self.steps[table] = versions.to(self.device)

    def rows(self, requests: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Hot rows from the replicas, cold rows from the shards."""
        cold_requests, out = {}, {}
        for table, ids in requests.items():
            position, hot = self._locate(table, ids)
            self._positions[table] = (position, hot)
            rows = torch.empty(len(ids), self.specs[table].dim)
            if bool(hot.any()):
                rows[hot] = self.weights[table][position[hot].to(self.device)].cpu()
            if not bool(hot.all()):
                cold_requests[table] = ids[~hot]
            out[table] = rows
            self.hits += int(hot.sum())
            self.lookups += len(ids)
        for table, (cold_rows, _) in self.client.pull_many(cold_requests).items():
            out[table][~self._positions[table][1]] = cold_rows
        return out

    def apply_gradients(self, updates: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """All-reduce hot-row gradients across ranks and apply them; push cold ones."""
        tables = list(self.hot_ids)
        sums = {
            t: torch.zeros(len(self.hot_ids[t]), self.specs[t].dim, device=self.device)
            for t in tables
        }
        touched = {t: torch.zeros(len(self.hot_ids[t]), device=self.device) for t in tables}
        cold = {}
        for table, (ids, grads) in updates.items():
            position, hot = self._positions.pop(table)
            if table in sums and bool(hot.any()):
                where = position[hot].to(self.device)
                scatter_add_rows(sums[table], where, grads[hot].to(self.device).contiguous())
                touched[table][where] = 1.0
            if not bool(hot.all()):
                cold[table] = (ids[~hot], grads[~hot])
        flat = torch.cat([x.reshape(-1) for t in tables for x in (sums[t], touched[t])])
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flat)  # every rank calls this once per step, in the same table order
        offset = 0
        for table in tables:
            size = sums[table].numel()
            grad = flat[offset : offset + size].view_as(sums[table])
            hit = flat[offset + size : offset + size + len(touched[table])] > 0
            offset += size + len(touched[table])
            if bool(hit.any()):
                self._update(table, hit.nonzero().squeeze(1), grad[hit])
        self.client.push_many(cold)

    def flush(self) -> None:
        """Write the hot rows, their optimizer state and versions back (writer rank only)."""
        if self.writer:
            for table, ids in self.hot_ids.items():
                if len(ids):
                    self.client.assign(
                        table,
                        ids,
                        self.weights[table].cpu(),
                        self.state[table].cpu(),
                        versions=self.steps[table].cpu(),
                    )
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()  # no rank reads the shards before the write-back is done

    def _update(self, table: str, rows: torch.Tensor, grads: torch.Tensor) -> None:
        weights, state = self.weights[table][rows], self.state[table][rows]
        self.steps[table][rows] += 1
        apply_rows(self.specs[table].optimizer, weights, state, grads, self.steps[table][rows])
        self.weights[table][rows] = weights
        self.state[table][rows] = state

    def _locate(self, table: str, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hot_ids = self.hot_ids.get(table)
        if hot_ids is None or not len(hot_ids):
            return torch.zeros(len(ids), dtype=torch.int64), torch.zeros(len(ids), dtype=torch.bool)
        position = torch.searchsorted(hot_ids, ids).clamp(max=len(hot_ids) - 1)
        return position, hot_ids[position] == ids
