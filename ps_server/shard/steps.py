"""StepService: the step data plane of one shard, Lookup and clocked Update.

A step's lookup and update carry every table the step touches on this shard.
Updates carry the rank's step clock (see the .proto): in EXACT mode the
shard buffers each rank's update of a clock and, once every rank's is in,
applies their summed gradients as one optimizer step per row, as one write
(logged as one record); in ASYNC mode each update is applied when the rank's
previous clock has been. A lookup that names a clock waits until the job's
watermark reaches it. An update's answer carries the refresh rows its clock
changed, read once the clock is applied, and (EXACT mode) the rows of a later
step's lookup riding on it, read after that too.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import torch
from ember.ps_server.errors import (
    CallEndedError,
    CheckpointStateError,
    ClockTimeoutError,
    ClockTooLargeError,
    InvalidArgumentError,
    StoreCorruptError,
    SupersededError,
    TooManyWaitingError,
)
from ember.ps_server.id_arrays import sum_duplicates
from ember.ps_server.shard.call_watch import CallWatch
from ember.ps_server.shard.replica_flush import ReplicaFlushes, check_job_name
from ember.ps_server.shard.request_checks import (
    step_request_id,
    version_and_state,
    weights_and_int64,
    weights_only,
)
from ember.ps_server.shard.step_clocks import EXACT_APPLIER, MAX_CLOCKS_AHEAD, Job, StepClocks
from ember.ps_server.shard.step_requests import TableUpdate, checked_reads, checked_updates
from ember.ps_server.shard.step_rows import AppliedUpdate, TableRead, refreshed_rows
from ember.ps_server.shard.table_passes import push_tables
from ember.ps_server.wire.messages import pb
from ember.ps_server.wire.row_dtype import RowDtype
from ember.ps_server.wire.step_codec import LookupRequestView, StepClockView, UpdateRequestView

if TYPE_CHECKING:
    from ember.ps_server.shard.server import ParameterServer

# protobuf's limit on one message (2 GiB), less room for names and framing: the most one
# write-ahead log record of an exact clock's summed update may hold.
MAX_LOGGED_CLOCK_BYTES = (2 << 30) - (64 << 20)


class StepService:
    """Lookup and Update on the tables of ``server``; ``max_waiting`` and ``max_asking`` as
    :class:`ParameterServer` takes them."""

    def __init__(self, server: ParameterServer, max_waiting: int | None, max_asking: int) -> None:
        self._server = server
        self.clocks = StepClocks(max_waiting)
        self.replicas = ReplicaFlushes(self.clocks.slots, max_asking)
        self.max_logged_clock_bytes = MAX_LOGGED_CLOCK_BYTES

    def lookup(
        self, request: LookupRequestView, call: CallWatch | None = None
    ) -> tuple[list[TableRead], int]:
        """The validated reads of every table of ``request``, in order, once its clock is
        reached (their rows are written by :mod:`ember.ps_server.shard.step_rows`); a wait
        ends early when ``call``'s caller is gone.

        Returns:
            ``(reads, the job's watermark or -1)``.
        """
        self._server.fault.check()
        reads = checked_reads(self._server.checks, request.tables, "lookup", weights_only)
        self._server.checks.replies_fit([(t, len(ids), weights_only(t)) for t, ids, _ in reads])
        watermark = -1
        if request.clock is not None:
            needed = request.clock.clock
            if needed < -1:
                raise InvalidArgumentError(f"a lookup's clock must be >= -1, got {needed}")
            with self.clocks.using(request.clock) as job, job.cond:
                if job.refusal(needed) is not None:
                    raise ClockTooLargeError(job.refusal(needed))
                if needed > job.watermark + MAX_CLOCKS_AHEAD:  # no update may be that far ahead
                    raise InvalidArgumentError(
                        f"a lookup of clock {needed} is more than {MAX_CLOCKS_AHEAD} clocks past "
                        f"job {job.name!r}'s watermark {job.watermark}"
                    )
                job.wait(
                    lambda: job.watermark >= needed or job.refusal(needed) is not None,
                    _deadline(request.clock),
                    f"clock {needed} for a lookup of rank {request.clock.rank}", needed, call,
                )  # fmt: skip
                if job.watermark < needed:
                    raise ClockTooLargeError(job.refusal(needed))
                watermark = job.watermark
        return reads, watermark

    def update(self, request: UpdateRequestView, call: CallWatch | None = None) -> AppliedUpdate:
        """Apply one rank's update of one clock (see the module docstring); a wait ends
        early when ``call``'s caller is gone.

        Raises:
            InvalidArgumentError: a malformed request, or reads riding on an ASYNC-mode
                update (nothing buffered or applied).
            ClockTimeoutError: the other ranks did not deliver in time (nothing applied).
            CallEndedError: the caller went away while the update waited (nothing
                applied, unless every rank's update of its clock was in).
            ClockTooLargeError: under a write-ahead log, the clock's summed update is larger
                than one record holds (nothing of it applied, every rank told).
        """
        self._server.fault.check()
        clock = request.clock
        if clock is None or clock.clock < 0:
            raise InvalidArgumentError("an update needs a clock >= 0 (clock.clock)")
        checks = self._server.checks
        updates = checked_updates(checks, request.tables)
        refresh = checked_reads(checks, request.refresh, "refresh", weights_and_int64)
        reads = checked_reads(checks, request.read, "read", weights_only)
        states = checked_reads(checks, request.read_state, "read_state", version_and_state)
        if (reads or states) and clock.mode != pb.EXACT:
            raise InvalidArgumentError(
                "an update's read needs EXACT mode (only there is its clock every rank's once "
                "applied); send a Lookup with the clock instead"
            )
        checks.replies_fit(
            [(t, len(ids), weights_and_int64(t)) for t, ids, _ in refresh]
            + [(t, len(ids), weights_only(t)) for t, ids, _ in reads]
            + [(t, len(ids), version_and_state(t)) for t, ids, _ in states]
        )

        def answer(duplicate: bool) -> AppliedUpdate:
            if duplicate:  # its first attempt may still be syncing its record, or have failed
                self._server.journal.durable()
            refreshed = refreshed_rows(job.changed.get(step), refresh)
            return AppliedUpdate(duplicate, refreshed, job.watermark, reads, states)

        with self.clocks.using(clock) as job:
            rank, step, deadline = clock.rank, clock.clock, _deadline(clock)
            with job.cond:
                if step <= job.applied[rank]:
                    return answer(duplicate=True)
                if job.refusal(step) is not None:
                    raise ClockTooLargeError(job.refusal(step))
                if step > job.watermark + MAX_CLOCKS_AHEAD:
                    raise InvalidArgumentError(
                        f"clock {step} of rank {rank} is more than {MAX_CLOCKS_AHEAD} clocks past "
                        f"job {job.name!r}'s watermark {job.watermark}"
                    )
                if request.replica:  # only once the update passed its checks
                    self.replicas.holds_replica(job.name)
                if job.mode == pb.EXACT:
                    self._buffer_and_await(job, clock, updates, deadline, call)
                else:
                    job.wait(
                        lambda: job.applied[rank] >= step - 1 and rank not in job.applying,
                        deadline, f"clock {step - 1} of rank {rank}", step - 1, call,
                    )  # fmt: skip
                    if step <= job.applied[rank]:  # a retry of this update won the race
                        return answer(duplicate=True)
                    job.applying.add(rank)
                    try:
                        self._write(job, clock, updates, log=True)
                    finally:
                        job.applying.discard(rank)
                        job.cond.notify_all()
                self._server.fault.check()  # the clock's log record may have failed to sync
                return answer(duplicate=False)

    def clocks_at_pause(self, flush_id: str) -> dict[str, dict]:
        """The jobs' clocks (see :meth:`StepClocks.snapshot`) as a checkpoint with
        ``flush_id`` pauses writes, its held write-back reports answered.

        Raises:
            CheckpointStateError: a replica job is not at the clock of its write-back
                (see :meth:`ReplicaFlushes.unflushed`); the flush is given up.
        """
        jobs = self.clocks.snapshot()  # writes are paused: nothing moves
        problems = self.replicas.unflushed(
            flush_id, {name: job["applied"] for name, job in jobs.items()}
        )
        self.replicas.settle(flush_id, paused=not problems)
        if problems:
            raise CheckpointStateError("; ".join(problems))
        return jobs

    def release_replica(self, job: str) -> None:
        """``job`` holds no hot-row replicas from now on (logged, so a restart knows)."""
        check_job_name(job)

        def record() -> list[bytes]:
            released = pb.ReplicaReleased(job=job)
            return [pb.LogRecord(replica_released=released).SerializeToString()]

        with self._server.gate.writing(), self._server.journal.record(record):
            self.replicas.release(job)
        self._server.fault.check()  # its log record may have failed to sync

    def replay(self, record: pb.StepApplied) -> None:
        """Apply a logged clock again at recovery (no log record is written)."""
        c = record.clock
        if any(t.dtype != RowDtype.FLOAT32 for t in record.tables):
            raise StoreCorruptError(
                f"the log record of job {c.job!r} clock {c.clock} holds gradients that are not "
                "float32; a shard logs float32 only"
            )
        updates = self._server.checks.writes(
            [(t.table, t.ids, t.grads, RowDtype.FLOAT32) for t in record.tables]
        )
        if record.replica:
            self.replicas.holds_replica(c.job, replaying=True)
        clock = StepClockView(c.job, c.world, c.rank, c.clock, c.mode, c.wait_ms)
        with self.clocks.using(clock) as job, job.cond:
            if (
                job.mode == pb.EXACT
                and clock.clock > job.watermark
                or job.mode == pb.ASYNC
                and clock.clock > job.applied[clock.rank]
            ):
                self._write(job, clock, updates, log=False)

    def _apply_complete_clocks(self, job: Job) -> None:
        """Apply, in order, every next clock whose updates from all ranks are in (unless
        another request is applying one: it goes on to the next clocks itself)."""
        while not job.applying and len(job.pending.get(job.watermark + 1, ())) == job.world:
            step = job.watermark + 1
            by_rank = job.pending[step]
            merged: dict[str, list[TableUpdate]] = {}
            for rank in range(job.world):
                for update in by_rank[rank]:
                    merged.setdefault(update[0].spec.name, []).append(update)
            updates = [_joined_parts(parts) for parts in merged.values()]
            clock = StepClockView(job.name, job.world, 0, step, job.mode, 1)
            job.applying.add(EXACT_APPLIER)
            try:
                self._write(job, clock, updates, log=True)  # raises with the clock still pending
            except ClockTooLargeError as error:  # its waiters are told; nothing applied
                job.refused = (step, str(error))
                job.pending.clear()  # no clock from it on can ever apply here
                self._server.gate.recheck()  # a checkpoint waiting for this clock gives up
                return
            finally:
                job.applying.discard(EXACT_APPLIER)
                if job.watermark >= step:  # applied, even if its log record then failed
                    job.pending.pop(step, None)
                job.cond.notify_all()
            job.cond.notify_all()

    def _write(self, job: Job, clock: StepClockView, updates: list[TableUpdate], log: bool) -> None:
        """One optimizer step per distinct row of ``updates``, logged as one record; the rows
        are remembered as changed by ``clock`` (for refreshes). ``updates``' arrays are only
        read: an exact clock's stay pending, uncopied, until it applies (a failed write is
        tried again with the same arrays)."""
        rank = clock.rank if job.mode == pb.ASYNC else None
        request_id = step_request_id(job.name, clock.clock, rank)
        summed = []
        for target, ids, grads in updates:
            writable = np.require(grads, np.float32, requirements=["C", "W"])  # replays: views
            unique_ids, rows = sum_duplicates(ids, torch.from_numpy(writable))
            summed.append((target, unique_ids, rows))
        size = sum(ids.nbytes + rows.nbytes for _, ids, rows in summed)
        if log and self._server.journal.log is not None and size > self.max_logged_clock_bytes:
            raise ClockTooLargeError(
                f"clock {clock.clock} of job {job.name!r} sums to {size} bytes of ids and "
                f"gradients on this shard, more than one write-ahead log record holds "
                f"({self.max_logged_clock_bytes}): nothing of it is applied here, and the "
                "job cannot go past it on this shard. Other shards may apply their part, "
                "which splits the job's rows: checkpoints then fail until the cluster is "
                "restored from one taken before. Use more shards or smaller batches"
            )

        def record() -> list[bytes]:
            applied = pb.StepApplied(
                clock=pb.StepClock(
                    job=job.name, world=job.world, rank=clock.rank, clock=clock.clock,
                    mode=job.mode, wait_ms=1,
                ),
                replica=self.replicas.holding(job.name),
                tables=[
                    pb.TableGrads(table=t.spec.name, ids=i.astype("<i8").tobytes(),
                                  grads=g.numpy().tobytes())
                    for t, i, g in summed
                ],
            )  # fmt: skip
            return [pb.LogRecord(step=applied).SerializeToString()]

        def apply() -> None:
            push_tables(summed, request_id)
            job.mark_applied(clock.rank, clock.clock)

        if log:
            # The clock counts as applied inside the gate, with its rows: a checkpoint's pause
            # never sees one without the other. While a pause holds this write, the job's
            # condition is released (lookups and other ranks go on; ``job.applying`` keeps
            # another request from applying the same clock meanwhile).
            tag = (job.name, clock.rank, clock.clock)
            server = self._server
            with server.gate.writing(tag, release=job.cond), server.journal.record(record):
                apply()
        else:
            apply()
        job.remember_changed(clock.clock, {t.spec.name: ids for t, ids, _ in summed})

    def _buffer_and_await(
        self,
        job: Job,
        clock: StepClockView,
        updates: list[TableUpdate],
        deadline: float,
        call: CallWatch | None,
    ) -> None:
        """Buffer a rank's update of an exact-mode clock, apply the clock once every rank's
        is in, and wait until it is applied (the caller holds the job's condition).

        A retry of the update owns the buffered entry from its arrival: the earlier
        attempts, whose client gave up on them, stop waiting (SupersededError), and only
        the owner withdraws the entry when it gives up.

        Raises:
            ClockTimeoutError, TooManyWaitingError, CallEndedError: it was not applied, and
                the update is withdrawn. CallEndedError also when the clock is complete and
                its write held by a checkpoint's pause: it will be applied, and nobody
                waits to hear so.
            SupersededError: a retry took over (it answers the client).
            ClockTooLargeError: the clock's summed update is too large to log; nothing of
                it is applied, and no later clock of the job can be.
        """
        rank, step, entry = clock.rank, clock.clock, (clock.clock, clock.rank)
        if call is not None and call.ended:
            raise CallEndedError(f"the caller of rank {rank}'s clock {step} went away")
        job.pending.setdefault(step, {}).setdefault(rank, updates)
        job.attempts_started += 1
        attempt = job.owners[entry] = job.attempts_started
        job.attempts[entry] += 1
        job.cond.notify_all()  # an earlier attempt of it stops waiting

        def applied() -> bool:
            return job.applied[rank] >= step

        def superseded() -> bool:
            return job.owners.get(entry) != attempt

        def done() -> bool:
            return applied() or superseded() or job.refusal(step) is not None

        try:
            self._apply_complete_clocks(job)
            take_slot = True
            while True:
                try:
                    # Earlier attempts leave at once, each giving its wait slot back.
                    job.wait(
                        lambda: done() or job.attempts[entry] == 1,
                        deadline, f"clock {step}", step, call, take_slot=False,
                    )  # fmt: skip
                    job.wait(
                        done, deadline, f"clock {step}", step,
                        call, take_slot=take_slot,
                    )  # fmt: skip
                except (ClockTimeoutError, TooManyWaitingError, CallEndedError) as error:
                    if not job.being_applied(step):
                        if not superseded():
                            job.withdraw(step, rank)  # told "not applied": it never will be
                        raise
                    if isinstance(error, CallEndedError):
                        raise
                    # Complete, its write held by a checkpoint's pause: wait it out, with or
                    # without a slot (the pause's lease bounds the wait).
                    deadline, take_slot = _deadline(clock), False
                    continue
                if applied():
                    return
                if job.refusal(step) is not None:
                    raise ClockTooLargeError(job.refusal(step))
                raise SupersededError(
                    f"a retry of rank {rank}'s update of clock {step} took over this attempt"
                )
        finally:
            job.attempts[entry] -= 1
            if not job.attempts[entry]:
                del job.attempts[entry]
            if not superseded():
                del job.owners[entry]


def _deadline(clock: StepClockView) -> float:
    return time.monotonic() + clock.wait_ms / 1000.0


def _joined_parts(parts: list[TableUpdate]) -> TableUpdate:
    """One table's updates of a clock from every rank as one: its ids and gradients joined
    in rank order (one rank's as they are: no copy of a large update)."""
    if len(parts) == 1:
        return parts[0]
    return parts[0][0], np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])
