"""StepClocks: the clocks of training jobs on one shard, and the waits on them.

Per job: its world size and update mode, each rank's highest applied clock,
the updates buffered for clocks not yet applied (EXACT mode: until every
rank's is in), and which rows each recent clock changed (for refreshes). The
watermark is the lowest applied clock over the ranks. Requests wait on a
job's condition, never poll, and give up at their deadline naming the ranks
the job waits for. Jobs are kept for the most recent :data:`MAX_JOBS`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from ember.ps_server.errors import ClockTimeoutError, InvalidArgumentError
from ember.ps_server.shard.call_watch import CallWatch
from ember.ps_server.shard.waits import WaitSlots, wait_until
from ember.ps_server.wire.messages import pb
from ember.ps_server.wire.step_codec import StepClockView

MAX_JOBS = 64
EXACT_APPLIER = -1  # Job.applying's mark for an exact-mode clock being applied
MAX_WORLD = 65_536  # ranks of one job
MAX_CLOCKS_AHEAD = 1_024  # how far past the watermark an update's clock may be
RETIRED_RANKS = 1 << 20  # clocks of forgotten jobs kept, over all their ranks (cuts, returns)
MAX_WAIT_MS = 3_600_000
MAX_JOB_CHARS = 128
REMEMBERED_CLOCKS = 8  # clocks whose changed rows are kept for refreshes
MODES = {pb.EXACT: "exact", pb.ASYNC: "async"}
RANKS_NAMED = 10  # ranks a timeout names: its message must fit gRPC's trailing metadata


@dataclasses.dataclass
class Job:
    """One job's clock state on this shard (guarded by its condition)."""

    name: str
    world: int
    mode: int
    applied: list[int]
    pending: dict[int, dict[int, Any]] = dataclasses.field(default_factory=dict)
    changed: collections.OrderedDict[int, dict[str, np.ndarray]] = dataclasses.field(
        default_factory=collections.OrderedDict
    )
    cond: threading.Condition = dataclasses.field(default_factory=threading.Condition)
    slots: WaitSlots = dataclasses.field(kw_only=True)  # the shard's, shared by its jobs
    waiters: int = 0
    users: int = 0  # requests using the job now (guarded by StepClocks' lock, not the job's)
    # Exact-mode requests (a rank's update and its retries) under way for each buffered
    # (clock, rank) entry, and the newest of them, which owns the entry: a retry means
    # the client gave up on the earlier attempts, which leave; only the owner withdraws.
    attempts: collections.Counter[tuple[int, int]] = dataclasses.field(
        default_factory=collections.Counter
    )
    owners: dict[tuple[int, int], int] = dataclasses.field(default_factory=dict)
    attempts_started: int = 0
    # The exact-mode clock this shard refused to apply, and why: the job cannot go past it.
    refused: tuple[int, str] | None = None
    # Requests applying an update now (ASYNC: their ranks; EXACT: EXACT_APPLIER); such a
    # request may have released the condition while a checkpoint holds its write.
    applying: set[int] = dataclasses.field(default_factory=set)

    def refusal(self, clock: int) -> str | None:
        """Why ``clock`` can never be applied (a clock at or before it was refused), or None."""
        if self.refused is not None and self.refused[0] <= clock:
            return self.refused[1]
        return None

    @property
    def watermark(self) -> int:
        """The highest clock up to which every rank's updates are applied (-1: none)."""
        return min(self.applied)

    def wait(
        self,
        ready: Callable[[], bool],
        deadline: float,
        what: str,
        needed: int,
        call: CallWatch | None = None,
        take_slot: bool = True,
    ) -> None:
        """Wait on the condition (held by the caller) until ``ready()``, in one of the
        shard's wait slots (``take_slot`` False: a wait the caller knows is short), for as
        long as ``call``'s caller is there (None: a caller this shard cannot watch).

        Raises:
            TooManyWaitingError: it is not ready and the shard lets no more requests wait.
            ClockTimeoutError: the deadline passed; names the ranks behind ``needed``.
            CallEndedError: the caller went away first.
        """
        if ready():
            return
        with self.slots.holding(what) if take_slot else contextlib.nullcontext():
            self.waiters += 1
            self.cond.notify_all()  # for await_waiters
            try:
                if not wait_until(self.cond, ready, deadline, what, call):
                    raise ClockTimeoutError(self._timeout_message(what, needed))
            finally:
                self.waiters -= 1

    def _timeout_message(self, what: str, needed: int) -> str:
        """Why a wait for ``what`` (clock ``needed``) gave up: the first ranks behind, and
        the range of applied clocks (a short message, however many ranks)."""
        delivered = self.pending.get(needed, {})
        behind = [
            r for r, clock in enumerate(self.applied) if clock < needed and r not in delivered
        ]
        named = ", ".join(map(str, behind[:RANKS_NAMED])) or "none"
        if len(behind) > RANKS_NAMED:
            named += f" and {len(behind) - RANKS_NAMED} more"
        applied = (
            f"applied clocks by rank: {self.applied}"
            if self.world <= RANKS_NAMED
            else f"applied clocks from {min(self.applied)} to {max(self.applied)} over "
            f"{self.world} ranks"
        )
        return (
            f"job {self.name!r}: gave up waiting for {what}: rank(s) {named} have not "
            f"delivered clock {needed} ({applied}); a rank has died or fallen behind"
        )

    def await_waiters(self, count: int, timeout_s: float) -> bool:
        """Wait until ``count`` requests wait on this job (tests, diagnostics); False on timeout."""
        with self.cond:
            return self.cond.wait_for(lambda: self.waiters >= count, timeout_s)

    def being_applied(self, clock: int) -> bool:
        """Whether exact-mode ``clock`` is being applied right now (its write may be held)."""
        return EXACT_APPLIER in self.applying and clock == self.watermark + 1

    def withdraw(self, clock: int, rank: int) -> None:
        """Take back ``rank``'s buffered update of a clock not applied (a rank that gave up
        waiting), so that the clock cannot complete without it being sent again."""
        by_rank = self.pending.get(clock)
        if by_rank is not None and clock > self.applied[rank] and not self.being_applied(clock):
            by_rank.pop(rank, None)
            if not by_rank:
                del self.pending[clock]

    def mark_applied(self, rank: int, clock: int) -> None:
        """Clock ``clock`` is applied: of every rank in EXACT mode, of ``rank`` in ASYNC.
        (One assignment, so readers without the condition see the old or the new list.)"""
        applied = list(self.applied)
        if self.mode == pb.EXACT:
            applied = [clock] * self.world
        else:
            applied[rank] = clock
        self.applied = applied

    def remember_changed(self, clock: int, changed: dict[str, np.ndarray]) -> None:
        """Record the rows ``clock`` changed (per table, kept sorted), forgetting the oldest
        clocks."""
        self.changed[clock] = {table: np.sort(ids) for table, ids in changed.items()}
        while len(self.changed) > REMEMBERED_CLOCKS:
            self.changed.popitem(last=False)


@dataclasses.dataclass(frozen=True)
class Retired:
    """A job forgotten as idle: its world, mode and last applied clocks."""

    world: int
    mode: int
    applied: tuple[int, ...]
    refused: tuple[int, str] | None


class StepClocks:
    """The jobs of one shard, by name.

    Args:
        max_waiting: requests that may wait at once, on clocks and other waits that share
            the slots (None: no limit).
    """

    def __init__(self, max_waiting: int | None = None) -> None:
        self.slots = WaitSlots(max_waiting)
        self._lock = threading.Lock()
        self._jobs: collections.OrderedDict[str, Job] = collections.OrderedDict()
        # Applied clocks of jobs forgotten as idle: a clock cut may still name them.
        self._retired: collections.OrderedDict[str, Retired] = collections.OrderedDict()
        self._retired_ranks = 0

    def job(self, clock: StepClockView, use: bool = False) -> Job:
        """The job ``clock`` names, created on first use (``use``: counted as in use; see
        :meth:`using`).

        Raises:
            InvalidArgumentError: a bad job name, world, rank, mode or wait, or one that
                disagrees with what the job was started with.
        """
        check_clock(clock)
        with self._lock:
            job = self._jobs.get(clock.job)
            if job is None:
                retired = self._retired.get(clock.job)
                if retired is not None:
                    _check_same_job(clock, retired.world, retired.mode)
                    self._unretire(clock.job)  # back from idle, with its clocks
                applied = list(retired.applied) if retired else [-1] * clock.world
                job = Job(clock.job, clock.world, clock.mode, applied, slots=self.slots)
                job.refused = retired.refused if retired else None
                self._jobs[clock.job] = job
                self._forget_idle()
            _check_same_job(clock, job.world, job.mode)
            self._jobs.move_to_end(clock.job)
            job.users += use
        return job

    @contextlib.contextmanager
    def using(self, clock: StepClockView) -> Iterator[Job]:
        """The job ``clock`` names (see :meth:`job`), never forgotten as idle while the block
        runs (a request between looking its job up and taking its condition holds none of
        the job's state that marks it busy)."""
        job = self.job(clock, use=True)
        try:
            yield job
        finally:
            with self._lock:
                job.users -= 1

    def applied_by_job(self) -> dict[str, list[int]]:
        """Each live job's highest applied clock per rank (-1: none yet)."""
        with self._lock:
            return {job.name: list(job.applied) for job in self._jobs.values()}

    def snapshot(self) -> dict[str, dict]:
        """Every job's world, mode and applied clocks, retired ones too (for checkpoints)."""
        with self._lock:
            jobs = [(j.name, j.world, j.mode, j.applied) for j in self._jobs.values()]
            jobs += [(name, r.world, r.mode, r.applied) for name, r in self._retired.items()]
        return {
            name: {"world": world, "mode": mode, "applied": list(applied)}
            for name, world, mode, applied in jobs
        }

    def cut_admits(self, cut: dict[str, list[int]]) -> Callable[[tuple[str, int, int]], bool]:
        """Whether a write tagged ``(job, rank, clock)`` lies within ``cut`` (per job, the
        highest clock of each rank a checkpoint holds); jobs outside the cut never do."""

        def admits(tag: tuple[str, int, int]) -> bool:
            job, rank, clock = tag
            clocks = cut.get(job)
            return clocks is not None and 0 <= rank < len(clocks) and clock <= clocks[rank]

        return admits

    def cut_reached(self, cut: dict[str, list[int]]) -> Callable[[], bool]:
        """Whether every job of ``cut`` has applied its clocks here (a job this shard has
        not seen has applied none).

        Raises:
            InvalidArgumentError: a job of the cut with another number of ranks.
        """
        with self._lock:
            for name, clocks in cut.items():
                job = self._jobs.get(name)
                if job is not None and len(clocks) != job.world:
                    raise InvalidArgumentError(
                        f"the clock cut gives job {name!r} {len(clocks)} rank(s); it runs "
                        f"{job.world}"
                    )

        def reached() -> bool:
            return all(
                all(a >= c for a, c in zip(self._applied(name, len(clocks)), clocks, strict=True))
                for name, clocks in cut.items()
            )

        return reached

    def refusals(self, cut: dict[str, list[int]]) -> list[str]:
        """Why this shard can never reach ``cut``: the refusal (see :attr:`Job.refused`) of
        each job of the cut that refused a clock the cut includes."""
        with self._lock:  # ``refused`` is set once, in one assignment: read without the job's
            refused = [
                (name, job.refused)
                for name in cut
                for job in (self._jobs.get(name), self._retired.get(name))
                if job is not None and job.refused is not None
            ]
        return [
            f"job {name!r}: {why}"
            for name, (step, why) in refused
            if step <= max(cut[name], default=-1)
        ]

    def _applied(self, name: str, world: int) -> list[int]:
        """A job's applied clocks by rank: a retired job's last ones, and -1 for a job this
        shard has not seen yet (its first clocks may still be on their way)."""
        job = self._jobs.get(name)
        retired = self._retired.get(name)
        applied = job.applied if job is not None else retired.applied if retired else None
        if applied is None:
            return [-1] * world
        if len(applied) != world:
            raise InvalidArgumentError(
                f"the clock cut gives job {name!r} {world} rank(s); it runs {len(applied)}"
            )
        return applied

    def restore(self, jobs: dict[str, dict]) -> None:
        """Replace every job's clocks by a :meth:`snapshot` (nothing pending)."""
        with self._lock:
            self._retired.clear()
            self._retired_ranks = 0
            self._jobs = collections.OrderedDict()
            for name, state in jobs.items():
                applied = list(state["applied"])
                self._jobs[name] = Job(
                    name, state["world"], state["mode"], applied, slots=self.slots
                )

    def _forget_idle(self) -> None:
        """Drop the least recently used idle jobs beyond MAX_JOBS (caller holds the lock)."""
        for name in list(self._jobs)[: max(0, len(self._jobs) - MAX_JOBS)]:
            job = self._jobs[name]
            if not job.pending and not job.waiters and not job.applying and not job.users:
                del self._jobs[name]
                if max(job.applied) >= 0 or job.refused:  # else it is like an unseen one
                    self._retired[name] = Retired(
                        job.world, job.mode, tuple(job.applied), job.refused
                    )
                    self._retired_ranks += job.world
                while self._retired_ranks > RETIRED_RANKS:
                    self._unretire(next(iter(self._retired)))

    def _unretire(self, name: str) -> None:
        self._retired_ranks -= self._retired.pop(name).world


def _check_same_job(clock: StepClockView, world: int, mode: int) -> None:
    if (world, mode) != (clock.world, clock.mode):
        raise InvalidArgumentError(
            f"job {clock.job!r} runs {world} rank(s) in {MODES[mode]} mode; this request "
            f"says {clock.world} in {MODES.get(clock.mode, clock.mode)} mode"
        )


def sound_job_name(name: str) -> bool:
    """Whether ``name`` can name a job: 1..MAX_JOB_CHARS printable characters."""
    return 0 < len(name) <= MAX_JOB_CHARS and name.isprintable()


def check_clock(clock: StepClockView) -> None:
    """Raise InvalidArgumentError unless ``clock`` names a job, rank, mode and wait soundly."""
    if not sound_job_name(clock.job):
        raise InvalidArgumentError(
            f"clock.job must be 1..{MAX_JOB_CHARS} printable characters, got {clock.job[:40]!r}"
        )
    if not 1 <= clock.world <= MAX_WORLD or not 0 <= clock.rank < clock.world:
        raise InvalidArgumentError(
            f"clock.rank must be in 0..world-1 with world in 1..{MAX_WORLD}, got rank "
            f"{clock.rank} of {clock.world}"
        )
    if clock.mode not in MODES:
        raise InvalidArgumentError(f"clock.mode must be EXACT or ASYNC, got {clock.mode}")
    if not 0 < clock.wait_ms <= MAX_WAIT_MS:
        raise InvalidArgumentError(
            f"clock.wait_ms must be in 1..{MAX_WAIT_MS}, got {clock.wait_ms}"
        )
