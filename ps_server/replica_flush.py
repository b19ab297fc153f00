"""ReplicaFlushes: a checkpoint's wait for the jobs that train hot-row replicas (see the .proto).

Ranks that train replicas of hot rows hold rows the shards do not. A
checkpoint asks those jobs to write them back first: each replica job's
Updates are answered with the checkpoint's id until the job reports its
write-back, and the checkpoint waits for every replica job this shard knows.
The report is held until the checkpoint has paused writes, so the job takes
no further step before the pause and its clock cut is the step it flushed at.
"""

from __future__ import annotations

import collections
import threading
import time

from ember.ps_server.errors import ClockTimeoutError, InvalidArgumentError, TooManyJobsError
from ember.ps_server.step_clocks import MAX_JOBS, MAX_WAIT_MS, sound_job_name

REMEMBERED_CHECKPOINTS = 64  # checkpoints whose outcome (paused or not) held reports may ask


class ReplicaFlushes:
    """The replica jobs of one shard and the checkpoints waiting for their write-backs."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        # Per replica job, the clock it flushed at for each waiting checkpoint.
        self._jobs: dict[str, dict[str, int]] = {}
        self._waiting: list[str] = []  # checkpoints waiting for write-backs, oldest first
        # Checkpoints whose write-backs are in but that have not paused yet, with the time
        # they give up by (a coordinator that died must not hold new jobs for ever).
        self._windows: dict[str, float] = {}
        # Checkpoints that paused writes (True) or gave up (False), newest last.
        self._outcomes: collections.OrderedDict[str, bool] = collections.OrderedDict()

    def holds_replica(self, job: str, deadline: float) -> None:
        """Note that ``job`` holds replicas, before its update is applied. A job new here
        waits while a checkpoint is between its write-backs and its pause (it was not
        asked to flush, so it must take no step before that pause), until ``deadline``.

        Raises:
            TooManyJobsError: this shard already knows MAX_JOBS replica jobs.
            ClockTimeoutError: the deadline passed first (nothing applied).
        """
        with self._cond:
            if job in self._jobs:
                return
            if len(self._jobs) >= MAX_JOBS:
                raise TooManyJobsError(
                    f"this shard already has {MAX_JOBS} jobs holding replicas; a job that "
                    "finishes releases its place (ReplicasFlushed with release)"
                )
            while self._pausing():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ClockTimeoutError(
                        f"job {job!r}: a checkpoint that did not ask it for its replicas "
                        "has not paused writes in time; retry the update"
                    )
                self._cond.wait(min(remaining, self._next_expiry()))
            self._jobs[job] = {}
            self._cond.notify_all()

    def asked(self, job: str) -> str:
        """The oldest checkpoint waiting for ``job``'s write-back ("" when none)."""
        with self._cond:
            flushed = self._jobs.get(job)
            if flushed is None:
                return ""
            return next((c for c in self._waiting if c not in flushed), "")

    def request(self, checkpoint_id: str, wait_ms: int) -> dict[str, int]:
        """Wait until every replica job (those known now and those that appear meanwhile)
        has written its replicas back for ``checkpoint_id``; returns each job's clock.

        Raises:
            InvalidArgumentError: a bad id or wait.
            ClockTimeoutError: ``wait_ms`` passed first; names the jobs still holding rows.
        """
        _check_id(checkpoint_id, "checkpoint_id")
        deadline = _deadline(wait_ms)
        with self._cond:
            if checkpoint_id in self._waiting:
                raise InvalidArgumentError(f"checkpoint {checkpoint_id!r} already waits here")
            self._waiting.append(checkpoint_id)
            self._outcomes.pop(checkpoint_id, None)  # an id reused under another root
            try:
                while True:
                    behind = sorted(
                        j for j, done in self._jobs.items() if checkpoint_id not in done
                    )
                    if not behind:
                        self._windows[checkpoint_id] = deadline  # until it pauses or gives up
                        return {job: done[checkpoint_id] for job, done in self._jobs.items()}
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise ClockTimeoutError(
                            f"checkpoint {checkpoint_id!r}: job(s) {', '.join(behind)} did not "
                            f"write their hot-row replicas back within {wait_ms} ms (a trainer "
                            "died, or is stuck); a checkpoint without their rows needs "
                            "--no-flush"
                        )
                    self._cond.wait(remaining)
            finally:
                self._waiting.remove(checkpoint_id)
                for done in self._jobs.values():
                    done.pop(checkpoint_id, None)

    def flushed(
        self, job: str, checkpoint_id: str, clock: int, release: bool, wait_ms: int
    ) -> bool:
        """``job`` wrote its replicas back after ``clock`` (for ``checkpoint_id``, if any);
        with ``release`` it holds none from now on. For a checkpoint (and without
        ``release``) the call then waits until that checkpoint paused writes (True) or gave
        up, or ``wait_ms`` passed (False), so the job takes no step before the pause.

        Raises:
            InvalidArgumentError: a bad job name, id, clock or wait (nothing recorded).
        """
        if not sound_job_name(job):
            raise InvalidArgumentError(f"job must be 1..128 printable characters, got {job[:40]!r}")
        if checkpoint_id:
            _check_id(checkpoint_id, "checkpoint_id")
        if clock < -1:
            raise InvalidArgumentError(f"a flushed clock must be >= -1, got {clock}")
        deadline = _deadline(wait_ms)
        with self._cond:
            if release:
                self._jobs.pop(job, None)
            elif checkpoint_id in self._waiting and job in self._jobs:
                self._jobs[job][checkpoint_id] = clock
            self._cond.notify_all()
            if release or not checkpoint_id:
                return False
            while checkpoint_id not in self._outcomes:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return self._outcomes[checkpoint_id]

    def settle(self, checkpoint_id: str, paused: bool) -> None:
        """Record that ``checkpoint_id`` paused writes or gave up (the first word counts)."""
        with self._cond:
            self._windows.pop(checkpoint_id, None)
            self._outcomes.setdefault(checkpoint_id, paused)
            while len(self._outcomes) > REMEMBERED_CHECKPOINTS:
                self._outcomes.popitem(last=False)
            self._cond.notify_all()

    def _pausing(self) -> bool:
        """Whether a checkpoint is between its write-backs and its pause (caller holds the
        condition); expired ones are dropped."""
        now = time.monotonic()
        for checkpoint_id, until in list(self._windows.items()):
            if until <= now:
                del self._windows[checkpoint_id]
        return bool(self._windows)

    def _next_expiry(self) -> float:
        return max(0.0, min(self._windows.values()) - time.monotonic())

    def jobs(self) -> list[str]:
        """The replica jobs this shard knows (diagnostics, tests)."""
        with self._cond:
            return sorted(self._jobs)


def _check_id(checkpoint_id: str, field: str) -> None:
    if not sound_job_name(checkpoint_id):
        raise InvalidArgumentError(
            f"{field} must be 1..128 printable characters, got {checkpoint_id[:40]!r}"
        )


def _deadline(wait_ms: int) -> float:
    if not 0 < wait_ms <= MAX_WAIT_MS:
        raise InvalidArgumentError(f"wait_ms must be in 1..{MAX_WAIT_MS}, got {wait_ms}")
    return time.monotonic() + wait_ms / 1000.0
