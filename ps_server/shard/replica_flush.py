"""ReplicaFlushes: the jobs that train hot-row replicas, and checkpoints' requests that they
write them back first (see FlushReplicas in the .proto).

Ranks that train replicas of hot rows hold rows the shards do not. A
checkpoint asks those jobs to write them back: each replica job's Updates are
answered with the checkpoint's flush id until the job reports its
write-back, and the checkpoint waits for every replica job this shard knows.
The report is held until the checkpoint has paused writes, so the job takes
no further step before the pause, and at the pause the shard checks every
replica job's report against its clocks. Released jobs are remembered, so a
straggling Update cannot count one again.
"""

from __future__ import annotations

import collections
import threading
import time

from ember.ps_server.errors import (
    ClockTimeoutError,
    InvalidArgumentError,
    ReplicaReleasedError,
    TooManyJobsError,
    TooManyWaitingError,
)
from ember.ps_server.shard.call_watch import CallWatch
from ember.ps_server.shard.step_clocks import MAX_WAIT_MS, sound_job_name
from ember.ps_server.shard.waits import WaitSlots, wait_until

# Replica jobs per shard. Each one that has reported holds a shard worker thread, in one of
# its wait slots, until the pause, so this stays well below the shard's workers (32 by default).
MAX_REPLICA_JOBS = 16
# Most checkpoints asking for write-backs at once (each holds a worker thread, not a wait slot:
# the reports it waits for need those; a shard process allows fewer with fewer threads).
MAX_ASKING = 4
REMEMBERED_FLUSHES = 64  # flush ids whose outcome (paused or not) held reports may ask
REPORTS_PER_JOB = 8  # reports kept per job for flushes not settled yet
MAX_RELEASED = 4096  # released job names remembered (oldest forgotten first)


class ReplicaFlushes:
    """The replica jobs of one shard and the flushes checkpoints ask of them."""

    def __init__(self, slots: WaitSlots | None = None, max_asking: int = MAX_ASKING) -> None:
        if max_asking < 1:
            raise ValueError(f"max_asking must be >= 1, got {max_asking}")
        self._slots = slots if slots is not None else WaitSlots()
        self._max_asking = max_asking
        self._cond = threading.Condition()
        # Per replica job, the clock it reported for each flush id not settled yet.
        self._jobs: dict[str, collections.OrderedDict[str, int]] = {}
        self._asking: list[str] = []  # flush ids whose FlushReplicas waits, oldest first
        # Flushes whose checkpoint paused writes (True) or gave up (False), newest last.
        self._outcomes: collections.OrderedDict[str, bool] = collections.OrderedDict()
        self._released: collections.OrderedDict[str, None] = collections.OrderedDict()

    def holds_replica(self, job: str, replaying: bool = False) -> None:
        """Count ``job`` as a replica job (an Update says it holds replicas; ``replaying``: a
        logged one, counted whatever the limits).

        Raises:
            ReplicaReleasedError: ``job`` released its replicas before.
            TooManyJobsError: this shard already counts MAX_REPLICA_JOBS others.
        """
        with self._cond:
            if replaying:
                self._jobs.setdefault(job, collections.OrderedDict())
            elif job in self._released:
                raise ReplicaReleasedError(
                    f"job {job!r} released its hot-row replicas; it cannot hold them again "
                    "(a new run needs a new job name)"
                )
            else:
                self._job(job)

    def holding(self, job: str) -> bool:
        """Whether ``job`` counts as a replica job here."""
        with self._cond:
            return job in self._jobs

    def release(self, job: str) -> None:
        """``job`` holds no replicas from now on (it ended, or its trainer died)."""
        with self._cond:
            self._jobs.pop(job, None)
            self._released[job] = None
            self._released.move_to_end(job)
            while len(self._released) > MAX_RELEASED:
                self._released.popitem(last=False)
            self._cond.notify_all()

    def asking(self) -> list[str]:
        """The flush ids checkpoints wait for now, oldest first."""
        with self._cond:
            return list(self._asking)

    def asked(self, job: str) -> str:
        """The oldest flush id waiting for ``job``'s write-back ("" when none)."""
        with self._cond:
            reports = self._jobs.get(job)
            if reports is None:
                return ""
            return next((f for f in self._asking if f not in reports), "")

    def request(self, flush_id: str, wait_ms: int, call: CallWatch | None = None) -> dict[str, int]:
        """Wait until every replica job (those known now and those that appear meanwhile)
        has reported a write-back for ``flush_id``, for as long as ``call``'s caller is
        there; returns each job's clock.

        Raises:
            InvalidArgumentError: a bad id or wait, or an id already asked for.
            ClockTimeoutError: ``wait_ms`` passed first; names the jobs that did not report.
            TooManyWaitingError: ``max_asking`` checkpoints ask already (nothing asked).
            CallEndedError: the caller went away first (the jobs are no longer asked).
        """
        _check_id(flush_id)
        deadline = _deadline(wait_ms)
        what = f"the replica write-backs of flush {flush_id!r}"

        def behind() -> list[str]:
            return sorted(j for j, reports in self._jobs.items() if flush_id not in reports)

        with self._cond:
            if flush_id in self._asking or flush_id in self._outcomes:
                raise InvalidArgumentError(f"flush id {flush_id!r} was used before")
            if len(self._asking) >= self._max_asking:
                raise TooManyWaitingError(
                    f"not waiting for {what}: {self._max_asking} checkpoint(s) already wait for "
                    "replica write-backs on this shard"
                )
            self._asking.append(flush_id)
            try:
                if not wait_until(self._cond, lambda: not behind(), deadline, what, call):
                    raise ClockTimeoutError(
                        f"job(s) {', '.join(behind())} did not report writing their hot-row "
                        f"replicas back within {wait_ms} ms: a trainer died or is stuck; for "
                        "a job whose trainer died: ember checkpoint --release-job JOB"
                    )
            finally:
                self._asking.remove(flush_id)
            return {job: reports[flush_id] for job, reports in self._jobs.items()}

    def flushed(
        self, job: str, flush_id: str, clock: int, wait_ms: int, call: CallWatch | None = None
    ) -> bool:
        """``job`` wrote its replicas back after ``clock`` for ``flush_id`` (if any). For a
        flush id the call then waits, in one of the shard's wait slots, until that
        checkpoint paused writes (True) or gave up, or ``wait_ms`` passed or no slot was
        free (False), so the job takes no step before the pause; it stops waiting when
        ``call``'s caller goes.

        Raises:
            InvalidArgumentError: a bad job name, id, clock or wait (nothing recorded).
            ReplicaReleasedError: ``job`` released its replicas before.
            TooManyJobsError: a job this shard does not count, beyond MAX_REPLICA_JOBS.
            CallEndedError: the caller went away first (the report is recorded).
        """
        check_job_name(job)
        if flush_id:
            _check_id(flush_id)
        if clock < -1:
            raise InvalidArgumentError(f"a flushed clock must be >= -1, got {clock}")
        deadline = _deadline(wait_ms) if flush_id else 0.0
        if flush_id:
            self.holds_replica(job)  # a report may come before any Update since a restart
        with self._cond:
            if not flush_id:
                return False
            if flush_id not in self._outcomes:
                reports = self._job(job)  # a report may come before this shard's request
                reports[flush_id] = clock
                while len(reports) > REPORTS_PER_JOB:
                    reports.popitem(last=False)
                self._cond.notify_all()

            def settled() -> bool:
                return flush_id in self._outcomes

            if not settled():
                what = f"the pause of flush {flush_id!r}"
                try:
                    self._slots.take(what)
                except TooManyWaitingError:  # the job goes on; its checkpoint then refuses
                    return False
                try:
                    if not wait_until(self._cond, settled, deadline, what, call):
                        return False
                finally:
                    self._slots.give()
            return self._outcomes[flush_id]

    def unflushed(self, flush_id: str, applied: dict[str, list[int]]) -> list[str]:
        """Why a checkpoint pausing writes now would hold some replica job's hot rows older
        than its other rows: per replica job that applied a clock here (``applied``, per
        job its clocks by rank), one that did not report for ``flush_id`` or is not at the
        clock it reported. Empty when none."""
        problems = []
        with self._cond:
            for job, reports in self._jobs.items():
                clocks, reported = applied.get(job, []), reports.get(flush_id)
                if reported is None and max(clocks, default=-1) >= 0:
                    problems.append(
                        f"job {job!r} holds hot-row replicas and had applied clocks {clocks}, "
                        "but did not write them back for this checkpoint (it started after "
                        "the request, or its report was lost)"
                    )
                elif reported is not None and any(c != reported for c in clocks):
                    problems.append(
                        f"job {job!r} wrote its hot-row replicas back after clock {reported}, "
                        f"but had applied clocks {clocks} (it went on before writes paused)"
                    )
        return problems

    def snapshot(self) -> dict[str, list[str]]:
        """The jobs holding replicas and those that released them (for checkpoints)."""
        with self._cond:
            return {"holding": sorted(self._jobs), "released": list(self._released)}

    def restore(self, state: dict[str, list[str]]) -> None:
        """Replace the jobs by a :meth:`snapshot` (nothing reported)."""
        with self._cond:
            self._jobs = {job: collections.OrderedDict() for job in state.get("holding", [])}
            self._released = collections.OrderedDict.fromkeys(state.get("released", []))
            self._cond.notify_all()

    def settle(self, flush_id: str, paused: bool) -> None:
        """``flush_id``'s checkpoint paused writes or gave up (the first word counts): held
        reports are answered, and the reports for it are dropped."""
        if not flush_id or not sound_job_name(flush_id):
            return
        with self._cond:
            self._outcomes.setdefault(flush_id, paused)
            while len(self._outcomes) > REMEMBERED_FLUSHES:
                self._outcomes.popitem(last=False)
            for reports in self._jobs.values():
                reports.pop(flush_id, None)
            self._cond.notify_all()

    def jobs(self) -> list[str]:
        """The replica jobs this shard counts (diagnostics, tests)."""
        with self._cond:
            return sorted(self._jobs)

    def _job(self, job: str) -> collections.OrderedDict[str, int]:
        """``job``'s reports, counting it first if new (caller holds the condition)."""
        reports = self._jobs.get(job)
        if reports is None:
            if len(self._jobs) >= MAX_REPLICA_JOBS:
                raise TooManyJobsError(
                    f"this shard already counts {MAX_REPLICA_JOBS} jobs holding replicas; a job "
                    "releases its place when it ends (or: ember checkpoint --release-job JOB)"
                )
            reports = self._jobs[job] = collections.OrderedDict()
            self._cond.notify_all()
        return reports


def check_job_name(job: str) -> None:
    """Raise InvalidArgumentError unless ``job`` can name a job."""
    if not sound_job_name(job):
        raise InvalidArgumentError(f"job must be 1..128 printable characters, got {job[:40]!r}")


def _check_id(flush_id: str) -> None:
    if not sound_job_name(flush_id):
        raise InvalidArgumentError(
            f"a flush id must be 1..128 printable characters, got {flush_id[:40]!r}"
        )


def _deadline(wait_ms: int) -> float:
    if not 0 < wait_ms <= MAX_WAIT_MS:
        raise InvalidArgumentError(f"wait_ms must be in 1..{MAX_WAIT_MS}, got {wait_ms}")
    return time.monotonic() + wait_ms / 1000.0
