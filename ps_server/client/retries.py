"""How long one call to a shard keeps being retried while the shard is UNAVAILABLE.

Two budgets, over the whole call. UNAVAILABLE answers that do not say the shard is
restarting (it cannot be reached, is stopping, or its store is unreachable) count against
``max_attempts``: the seconds while a restarting shard's process is replaced take a few of
them, and a shard that fails at every start runs out of them. Answers from a shard that
says it is restarting (it exits for its supervisor, or is rebuilding its rows from its
log) count against ``restart_patience_s`` instead, from the first such answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ember.ps_server.client.transport import TransportError
from ember.ps_server.errors import Status


class CallRetries:
    """The retry budget of one call (see the module docstring).

    Args:
        max_attempts: tries while the shard is UNAVAILABLE without saying it restarts.
        restart_patience_s: how long to wait for a shard that says it is restarting.
        clock: seconds, monotonic.

    Example:
        >>> retries = CallRetries(max_attempts=2, restart_patience_s=60)
        >>> retries.retry(TransportError(Status.UNAVAILABLE, "restarting", restarting=True))
        True
        >>> retries.retry(TransportError(Status.UNAVAILABLE, "connection refused"))
        True
        >>> retries.retry(TransportError(Status.UNAVAILABLE, "connection refused"))
        False
        >>> retries.gave_up(TransportError(Status.UNAVAILABLE, "connection refused"))
        'gave up after 2 attempts (max_attempts), 3 with those of a restarting shard'
    """

    def __init__(
        self,
        max_attempts: int,
        restart_patience_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_attempts = max_attempts
        self._patience_s = restart_patience_s
        self._clock = clock
        self._tries = 0
        self._unmarked = 0
        self._patient_until: float | None = None
        self._restarting = False

    @property
    def restarting(self) -> bool:
        """Whether the last failed try was answered by a shard that says it is restarting."""
        return self._restarting

    def retry(self, error: TransportError) -> bool:
        """Record a failed try; whether to try again (only UNAVAILABLE is retried)."""
        self._tries += 1
        self._restarting = error.restarting
        if error.status != Status.UNAVAILABLE:
            return False
        if error.restarting:
            now = self._clock()
            if self._patient_until is None:
                self._patient_until = now + self._patience_s
            return now < self._patient_until
        self._unmarked += 1
        return self._unmarked < self._max_attempts

    def gave_up(self, error: TransportError) -> str:
        """Which budget the call that ended with ``error`` ran out of ("" where it was not
        retryable)."""
        if error.status != Status.UNAVAILABLE:
            return ""
        if error.restarting:
            return (
                f"still restarting after restart_patience_s = {self._patience_s:g} s; "
                f"{_attempts(self._tries)}"
            )
        gave_up = f"gave up after {_attempts(self._unmarked)} (max_attempts)"
        if self._tries > self._unmarked:
            gave_up += f", {self._tries} with those of a restarting shard"
        return gave_up


def _attempts(count: int) -> str:
    return f"{count} attempt{'' if count == 1 else 's'}"
