"""ReplicatedRowSource: the static hot set replicated on every rank (FAE, OpenEmbedding).

Hot rows live on every rank and are trained like dense parameters: each step
the ranks all-reduce their hot-row gradients and apply the table's optimizer
(the shard's own update rule) to every touched row, so replicas stay identical
and exact, with no staleness. Only cold rows go through the parameter servers
each step.

The replicas take the rows over from the shards: ``warm()`` reads each hot
row's weights, optimizer state and version (its update count, Adam's step),
and ``flush()`` writes the rows stepped since the last flush back with
versions that count the steps taken, so the shards continue exactly where
the replicas stopped. With one rank nothing about hot rows crosses the
network until then.

Cold rows go through the step pipeline, which sees every step's calls with
the cold ids only. Its updates tell the shards that this job holds replicas,
and their answers carry a checkpoint's request for a write-back: the writer
rank raises it, all ranks flush after the same step, and the writer reports
the write-back, which the shards hold until the checkpoint has paused writes
(see the FlushReplicas comment in the .proto).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from typing import NamedTuple

import torch
import torch.distributed as dist
from ember.kernels.optim import fused_row_update, state_width
from ember.kernels.split import split_by_sorted_keys
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.wire.table_spec import TableSpec
from ember.trainer.pipeline import PipelinedRowSource
from ember.trainer.timer import Timer
from ember.trainer.traffic import CountingClient, TrafficStats

log = logging.getLogger(__name__)


_NO_IDS = torch.empty(0, dtype=torch.int64)  # the hot ids of a table without any


class _Split(NamedTuple):
    """Where one table's distinct ids of a step are: ``hot_at`` and ``cold_at`` their
    positions among the ids (ascending), ``replica_rows`` the replica row of each hot one
    (on the replicas' device)."""

    hot_at: torch.Tensor
    cold_at: torch.Tensor
    replica_rows: torch.Tensor


class ReplicatedRowSource:
    """A RowSource with ``hot_ids`` replicated on this rank (identical on every rank).

    Args:
        client: connected PSClient; its tables exist.
        specs: ``{table: TableSpec}`` of every table looked up.
        hot_ids: ``{table: ids}`` replicated on every rank; the same on all ranks.
        writer: whether this rank writes the hot rows back on ``flush()`` (one rank does).
        cold: the step pipeline of the other rows; its job must say it holds replicas.
        device: where the replicas live and their gradients are all-reduced (NCCL needs
            the GPU).

    Raises:
        ValueError: a cold pipeline whose job does not say it holds replicas (a checkpoint
            would not ask this job to write them back), or hot ids that repeat an id.
    """

    def __init__(
        self,
        client: PSClient,
        specs: dict[str, TableSpec],
        hot_ids: dict[str, torch.Tensor],
        writer: bool,
        cold: PipelinedRowSource,
        device: str | torch.device = "cpu",
    ) -> None:
        if not cold.steps.job.replica:
            raise ValueError(
                "the cold pipeline's StepJob must have replica=True, so that a checkpoint "
                "asks this job to write its replicas back first"
            )
        self.client = CountingClient(client)
        self.cold = cold
        self._blocked = Timer()  # on the shards or other ranks, besides the cold pipeline
        self._flushed_for = ""  # the last flush id this rank reported
        self.allreduce_bytes = 0
        self.specs = specs
        self.device = torch.device(device)
        self.hot_ids = {
            t: torch.sort(torch.as_tensor(ids, dtype=torch.int64)).values
            for t, ids in hot_ids.items()
        }
        for table, ids in self.hot_ids.items():  # ascending and distinct: what the split needs
            if len(ids) > 1 and not bool((ids[1:] > ids[:-1]).all()):
                raise ValueError(f"table {table!r}: the hot ids repeat an id")
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
        # Rows stepped since the last write-back (the same on every rank).
        self.dirty = {
            t: torch.zeros(len(ids), dtype=torch.bool, device=self.device)
            for t, ids in self.hot_ids.items()
        }
        sizes = [len(ids) for ids in self.hot_ids.values()]
        # Where each table's rows start when all hot rows are numbered in one sequence.
        self._offsets = dict(zip(self.hot_ids, itertools.accumulate([0, *sizes[:-1]])))
        self._hot_rows_total = sum(sizes)
        self.hits = self.lookups = 0
        self._splits: dict[str, _Split] = {}  # the last rows() call's, for its gradients
        # The next step's ids as prefetch located them (ids, split, cold ids), so rows()
        # neither searches again nor hands the cold source different tensors.
        self._located: dict[str, tuple[torch.Tensor, _Split, torch.Tensor]] = {}

    @property
    def blocked_s(self) -> float:
        """Seconds blocked on the cold pipeline, the hot rows' all-reduces and write-backs."""
        return self.cold.blocked_s + self._blocked.seconds

    def hit_rate(self) -> float:
        """Lookups served by replicated rows over all lookups."""
        return self.hits / self.lookups if self.lookups else 0.0

    @property
    def rows_written_back(self) -> int:
        """Hot rows this rank wrote back to the shards so far (the writer's count)."""
        return self.client.traffic.rows_pushed

    def warm(self) -> None:
        """Take the hot rows over: their weights, optimizer state and versions."""
        for table, ids in self.hot_ids.items():
            if len(ids):
                with self._blocked:
                    rows, state, versions = self.client.pull_with_state(table, ids)
                self.weights[table] = rows.to(self.device)
                self.state[table] = state.to(self.device)
                self.steps[table] = versions.to(self.device)

    @property
    def traffic(self) -> TrafficStats:
        """Bytes moved: the cold source's, and this source's own (taking the hot rows over,
        writing them back) as replica sync."""
        own = self.client.traffic
        sync = own.bytes_pulled + own.bytes_pushed + own.bytes_control
        return dataclasses.replace(self.cold.traffic, bytes_replica_sync=sync)

    def rows(self, requests: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Hot rows from the replicas, cold rows from the cold source."""
        out, cold, splits = self._hot_rows(requests, remember=True)
        return _with_cold(out, splits, self.cold.rows(cold))

    def read(self, requests: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Rows for evaluation, hot and cold alike."""
        out, cold, splits = self._hot_rows(requests, remember=False)
        return _with_cold(out, splits, self.cold.read(cold))

    def prefetch(self, requests: dict[str, torch.Tensor]) -> None:
        """Let the cold source start fetching the next step's cold rows."""
        self._located = {}
        for table, ids in requests.items():
            split = self._locate(table, ids)
            self._located[table] = (ids, split, ids.index_select(0, split.cold_at))
        self.cold.prefetch({table: located[2] for table, located in self._located.items()})

    def _hot_rows(
        self, requests: dict[str, torch.Tensor], remember: bool
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, _Split]]:
        """Rows with the hot ones filled in, and each table's cold ids and split."""
        cold, out, splits = {}, {}, {}
        for table, ids in requests.items():
            located = self._located.pop(table, None) if remember else None
            if located is not None and located[0] is ids:
                _, split, cold[table] = located
            else:
                split = self._locate(table, ids)
                cold[table] = ids.index_select(0, split.cold_at)
            if remember:
                self._splits[table] = split
                self.hits += len(split.hot_at)
                self.lookups += len(ids)
            rows = torch.empty(len(ids), self.specs[table].dim)
            if len(split.hot_at):
                hot_rows = self.weights[table].index_select(0, split.replica_rows)
                rows.index_copy_(0, split.hot_at, hot_rows.cpu())
            out[table], splits[table] = rows, split
        return out, cold, splits

    def apply_gradients(self, updates: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Apply the hot rows' gradients (summed over ranks) on every replica; hand cold ones on.

        With one rank the touched rows step at once. With several, two all-reduces:
        the touched mask over every hot row (one byte per row, and one for a checkpoint's
        request to flush), then the gradients of the rows any rank touched (their union,
        identical on every rank), so the bytes follow the rows a step touches, not the
        size of the hot set. When a checkpoint asked, every rank flushes after this step.
        The ids of each table are distinct (as the RowSource contract says): each hot row
        takes one optimizer step.
        """
        hot_grads, cold = {}, {}
        for table, (ids, grads) in updates.items():
            split = self._splits.pop(table)
            if table in self.hot_ids and len(split.hot_at):
                hot_grads[table] = (
                    split.replica_rows,
                    grads.index_select(0, split.hot_at).to(self.device),
                )
            cold[table] = (ids.index_select(0, split.cold_at), grads.index_select(0, split.cold_at))
        asked = self.cold.steps.flush_request if self.writer else ""
        flush = asked not in ("", self._flushed_for)
        if dist.is_initialized() and dist.get_world_size() > 1:
            hot_grads, flush = self._summed_over_ranks(hot_grads, flush)
        for table, (rows, grads) in hot_grads.items():
            if len(rows):
                self._update(table, rows, grads)
        self.cold.apply_gradients(cold)
        if flush:
            self.flush(flush_id=asked)

    def _summed_over_ranks(
        self, hot_grads: dict[str, tuple[torch.Tensor, torch.Tensor]], flush: bool
    ) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], bool]:
        """Every rank's hot-row gradients summed, per table ``(rows, grads)``: the rows any
        rank touched, ascending; and whether any rank wants to flush after this step.
        Every rank calls this once per step, tables in one order."""
        touched = torch.zeros(self._hot_rows_total + 1, dtype=torch.uint8, device=self.device)
        for table, (rows, _) in hot_grads.items():
            touched[self._offsets[table] + rows] = 1
        touched[-1] = int(flush)
        with self._blocked:  # reading the result waits for every rank (NCCL queues it)
            dist.all_reduce(touched, op=dist.ReduceOp.MAX)
            flush = bool(touched[-1])
        union = touched[:-1].nonzero().squeeze(1)  # hot-row numbers over all tables, ascending
        parts = {}
        for table, offset in self._offsets.items():
            inside = (union >= offset) & (union < offset + len(self.hot_ids[table]))
            rows = union[inside] - offset
            sums = torch.zeros(len(rows), self.specs[table].dim, device=self.device)
            if table in hot_grads:
                mine, grads = hot_grads[table]  # distinct rows, all in the union
                sums[torch.searchsorted(rows, mine)] = grads
            parts[table] = (rows, sums)
        flat = torch.cat([sums.reshape(-1) for _, sums in parts.values()])
        with self._blocked:
            dist.all_reduce(flat)
            if flat.is_cuda:  # queued, not done: wait here, where it counts as PS wait
                torch.cuda.current_stream(flat.device).synchronize()
        self.allreduce_bytes += touched.numel() + 4 * flat.numel()
        summed, start = {}, 0
        for table, (rows, sums) in parts.items():
            summed[table] = (rows, flat[start : start + sums.numel()].view_as(sums))
            start += sums.numel()
        return summed, flush

    def flush(self, flush_id: str = "", last: bool = False) -> None:
        """Write the hot rows stepped since the last flush back, with their optimizer state
        and versions (writer rank only), after the cold pipeline's updates are applied.
        Every rank calls it after the same step. Training may go on afterwards (a periodic
        flush bounds what a crashed trainer loses).

        Args:
            flush_id: a checkpoint's request for this write-back: once every rank's
                updates are applied, the writer reports it, and the shards hold the report
                (and so this job) until that checkpoint paused writes.
            last: this job trains no further; the shards stop counting it as a replica job.
        """
        failure = None
        try:
            self.cold.flush()
            for table, ids in self.hot_ids.items():
                rows = self.dirty[table].nonzero().squeeze(1)
                if self.writer and len(rows):
                    with self._blocked:
                        self.client.assign(
                            table,
                            ids[rows.cpu()],
                            self.weights[table][rows].cpu(),
                            self.state[table][rows].cpu(),
                            versions=self.steps[table][rows].cpu(),
                        )
                self.dirty[table][rows] = False
        except Exception as error:  # noqa: BLE001 - raised after both barriers, which every rank meets
            failure = error
        with self._blocked:
            _barrier()  # every rank's updates are applied (async mode: each rank's own)
            if failure is None and self.writer and (flush_id or last):
                try:
                    self._report(flush_id, last)
                except Exception as error:  # noqa: BLE001 - raised after the second barrier
                    failure = error
            _barrier()  # no rank steps (or reads the shards) before the write-back is reported
        if failure is not None:
            raise failure

    def release(self) -> None:
        """This job stops training without a last write-back (it failed): the shards stop
        counting it as a replica job, so checkpoints no longer wait for it (writer rank)."""
        if self.writer:
            self.cold.steps.replicas_flushed("", self.cold.last_clock, release=True)

    def _report(self, flush_id: str, last: bool) -> None:
        paused = self.cold.steps.replicas_flushed(flush_id, self.cold.last_clock, last)
        self._flushed_for = flush_id
        if flush_id and not last and not paused:
            log.warning(
                "the checkpoint of flush %s did not pause writes while this job waited after "
                "its write-back; if it goes on, it will refuse this job's clocks",
                flush_id,
            )

    def _update(self, table: str, rows: torch.Tensor, grads: torch.Tensor) -> None:
        """One optimizer step of the distinct hot ``rows`` in place, as the shard steps a row."""
        self.dirty[table][rows] = True
        fused_row_update(
            self.specs[table].optimizer, self.weights[table], self.state[table],
            self.steps[table], rows, grads.contiguous(),
        )  # fmt: skip

    def _locate(self, table: str, ids: torch.Tensor) -> _Split:
        hot_ids = self.hot_ids.get(table, _NO_IDS)
        hot_at, cold_at, replica_rows = split_by_sorted_keys(hot_ids, ids)
        return _Split(hot_at, cold_at, replica_rows.to(self.device))


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _with_cold(
    out: dict[str, torch.Tensor], splits: dict[str, _Split], cold_rows: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """``out`` with each table's cold rows placed where its ids are not hot."""
    for table, rows in cold_rows.items():
        if len(rows):
            out[table].index_copy_(0, splits[table].cold_at, rows)
    return out
