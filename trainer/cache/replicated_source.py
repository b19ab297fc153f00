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

import collections
import dataclasses
import logging
from typing import NamedTuple

import torch
import torch.distributed as dist
from ember.kernels.split import split_tables
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.wire.table_spec import TableSpec
from ember.trainer.cache.replica_groups import HotGrads, ReplicaGroups
from ember.trainer.lookahead import take_planned
from ember.trainer.pipeline import PipelinedRowSource, same_requests
from ember.trainer.timer import Timer
from ember.trainer.traffic import CountingClient, TrafficStats

log = logging.getLogger(__name__)


_NO_IDS = torch.empty(0, dtype=torch.int64)  # the hot ids of a table without any
_HELD = {"rows": "weights", "state": "state", "versions": "steps"}  # a pull's answer -> replica


class _Located(NamedTuple):
    """Where a step's ids are: positions count the ids of all tables of ``requests``,
    table after table. ``found_at`` the hot ones', ``replica_rows`` their rows in their
    group's replicas (on the host when planned ahead, on the replicas' device once the step
    takes it: see :meth:`ReplicatedRowSource._on_device`), ``found_counts`` each table's hot count;
    ``cold_at`` the other ids' positions and ``cold`` each table's cold ids."""

    requests: dict[str, torch.Tensor]
    found_at: torch.Tensor
    replica_rows: torch.Tensor
    found_counts: list[int]
    cold_at: torch.Tensor
    cold: dict[str, torch.Tensor]


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
            would not ask this job to write them back), hot ids that repeat an id, or
            tables of different row widths (a step's rows are one tensor).
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
        self.device = torch.device(device)
        self.hot_ids = {
            t: torch.sort(torch.as_tensor(ids, dtype=torch.int64)).values
            for t, ids in hot_ids.items()
        }
        for table, ids in self.hot_ids.items():  # ascending and distinct: what the split needs
            if len(ids) > 1 and not bool((ids[1:] > ids[:-1]).all()):
                raise ValueError(f"table {table!r}: the hot ids repeat an id")
        self.writer = writer
        widths = {spec.dim for spec in specs.values()}
        if len(widths) > 1:
            raise ValueError(f"the tables must share a row width, got {sorted(widths)}")
        self._dim = next(iter(widths), 0)
        # One set of replicas per optimizer: a step's hot rows of its tables step at once.
        self._replicas = ReplicaGroups(specs, self.hot_ids, self._dim, self.device)
        # Each table's rows in its group's tensors (views: what a step changes shows here).
        self.weights, self.state, self.steps, self.dirty = (
            self._replicas.views(name) for name in ("weights", "state", "steps", "dirty")
        )
        self.hits = self.lookups = 0
        self._served: _Located | None = None  # the last rows() call's, for its gradients
        # The next steps' ids as prefetch located them, oldest first, so rows() neither
        # searches again nor hands the cold source different tensors.
        self._located: collections.deque[_Located] = collections.deque(maxlen=self.cold.lookahead)

    @property
    def lookahead(self) -> int:
        """How many steps ahead :meth:`prefetch` takes ids for (the cold source's)."""
        return self.cold.lookahead

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
                for name, got in (("rows", rows), ("state", state), ("versions", versions)):
                    want = getattr(self, _HELD[name])[table].shape
                    if got.shape != want:  # copy_ would broadcast a short answer silently
                        raise ValueError(
                            f"table {table!r}: the shards answered {name} of shape "
                            f"{tuple(got.shape)} for the replica's {tuple(want)}"
                        )
                self.weights[table].copy_(rows)
                self.state[table].copy_(state)
                self.steps[table].copy_(versions)

    @property
    def traffic(self) -> TrafficStats:
        """Bytes moved: the cold source's, and this source's own (taking the hot rows over,
        writing them back) as replica sync."""
        own = self.client.traffic
        sync = own.bytes_pulled + own.bytes_pushed + own.bytes_control
        return dataclasses.replace(self.cold.traffic, bytes_replica_sync=sync)

    def rows(self, requests: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Hot rows from the replicas, cold rows from the cold source."""
        located = take_planned(self._located, lambda found: found.requests is requests)
        located = self._on_device(located or self._locate(requests))
        self._served = located
        self.hits += len(located.found_at)
        self.lookups += sum(len(ids) for ids in requests.values())
        return self._assembled(located, self.cold.rows(located.cold))

    def read(self, requests: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Rows for evaluation, hot and cold alike."""
        located = self._on_device(self._locate(requests))
        return self._assembled(located, self.cold.read(located.cold))

    def prefetch(self, requests: dict[str, torch.Tensor]) -> None:
        """Let the cold source start fetching the next announced step's cold rows (a planning
        thread may call it: it touches no device, see :mod:`ember.trainer.lookahead`)."""
        self._located.append(self._locate(requests))
        self.cold.prefetch(self._located[-1].cold)

    def _assembled(
        self, located: _Located, cold_rows: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """Each table's rows: the hot ones from the replicas, the others from ``cold_rows``
        (all tables' rows in one tensor on the replicas' device, handed out as a view per
        table: on a GPU the hot rows never leave it, and cold rows the cold source staged
        there already are not copied again)."""
        sizes = [len(ids) for ids in located.requests.values()]
        rows = torch.empty(sum(sizes), self._dim, device=self.device)
        for number, found_at, replica_rows in self._by_group(located):
            hot_rows = self._replicas.groups[number].weights.index_select(0, replica_rows)
            rows.index_copy_(0, found_at.to(self.device), hot_rows)
        if len(located.cold_at):
            cold = torch.cat([cold_rows[t] for t in located.cold])
            rows.index_copy_(0, located.cold_at.to(self.device), cold.to(self.device))
        return dict(zip(located.requests, rows.split(sizes)))

    def apply_gradients(self, updates: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Apply the hot rows' gradients (summed over ranks) on every replica; hand cold ones on.

        ``updates`` carries every table of the last :meth:`rows` call, in its order, or
        nothing (a step without gradients). With one rank the touched rows step at once.
        With several, two all-reduces: the touched mask over every hot row (one byte per
        row, and one for a checkpoint's request to flush), then the gradients of the rows
        any rank touched (their union, identical on every rank), so the bytes follow the
        rows a step touches, not the size of the hot set. When a checkpoint asked, every
        rank flushes after this step. The ids of each table are distinct (as the RowSource
        contract says): each hot row takes one optimizer step.

        Raises:
            ValueError: updates for other tables or ids than the last rows() served.
        """
        located, self._served = self._served, None
        hot_grads: HotGrads = {}
        cold = {}
        if updates:
            requests = {table: ids for table, (ids, _) in updates.items()}
            if (
                located is None
                or list(requests) != list(located.requests)
                or not same_requests(requests, located.requests)
            ):
                raise ValueError(
                    "apply_gradients takes the gradients of every table of the last rows() "
                    "call, in its order"
                )
            for table, (ids, grads) in updates.items():
                # One tensor for all tables: a short table would shift the next one's rows.
                if grads.dim() != 2 or len(grads) != len(ids):
                    raise ValueError(
                        f"table {table!r}: gradients of shape {tuple(grads.shape)} for "
                        f"{len(ids)} ids"
                    )
            grads = torch.cat([grads for _, grads in updates.values()])
            for number, found_at, replica_rows in self._by_group(located):
                hot_grads[number] = (replica_rows, grads.index_select(0, found_at).to(self.device))
            cold_counts = [len(ids) for ids in located.cold.values()]
            cold_grads = grads.index_select(0, located.cold_at).split(cold_counts)
            cold = {t: (ids, g) for (t, ids), g in zip(located.cold.items(), cold_grads)}
        asked = self.cold.steps.flush_request if self.writer else ""
        flush = asked not in ("", self._flushed_for)
        if dist.is_initialized() and dist.get_world_size() > 1:
            hot_grads, flush, sent = self._replicas.summed_over_ranks(
                hot_grads, flush, self._blocked
            )
            self.allreduce_bytes += sent
        self._replicas.step(hot_grads)
        self.cold.apply_gradients(cold)
        if flush:
            self.flush(flush_id=asked)

    def _by_group(self, located: _Located) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
        return self._replicas.by_group(
            list(located.requests), located.found_at, located.replica_rows, located.found_counts
        )

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

    def _locate(self, requests: dict[str, torch.Tensor]) -> _Located:
        tables, ids = list(requests), list(requests.values())
        found_at, cold_at, replica_rows, found_counts = split_tables(
            [self.hot_ids.get(t, _NO_IDS) for t in tables],
            ids,
            [self._replicas.key_start.get(t, 0) for t in tables],
        )
        cold_counts = [len(table_ids) - found for table_ids, found in zip(ids, found_counts)]
        cold_ids = (torch.cat(ids) if len(ids) > 1 else ids[0]).index_select(0, cold_at)
        cold = dict(zip(tables, cold_ids.split(cold_counts)))
        return _Located(requests, found_at, replica_rows, found_counts, cold_at, cold)

    def _on_device(self, located: _Located) -> _Located:
        """``located`` with its replica rows on the replicas' device. On the training thread:
        a copy to a GPU from pageable memory waits for the device's default stream, so a
        planning thread that made it would wait for the step's dense work."""
        return located._replace(replica_rows=located.replica_rows.to(self.device))


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
