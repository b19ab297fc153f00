"""How long one call to a shard keeps being retried while the shard is UNAVAILABLE.

Two budgets: UNAVAILABLE answers that do not say the shard is restarting (it cannot be
reached, or is stopping) count against ``max_attempts``; answers from a shard that says it
is restarting (it exits for its supervisor, or is rebuilding its rows from its log) do
not, for up to ``restart_patience_s`` from the first such answer. A shard that says so has
shown it is alive, so the count of other answers starts again from it: the gap while its
process is replaced gets the whole ``max_attempts``.
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
        self.restarting = False  # the last answer said the shard is restarting

    def retry(self, error: TransportError) -> bool:
        """Record a failed try; whether to try again (only UNAVAILABLE is retried)."""
        self._tries += 1
        self.restarting = error.restarting
        if error.status != Status.UNAVAILABLE:
            return False
        if error.restarting:
            now = self._clock()
            if self._patient_until is None:
                self._patient_until = now + self._patience_s
            self._unmarked = 0
            return now < self._patient_until
        self._unmarked += 1
        return self._unmarked < self._max_attempts

    def gave_up(self, error: TransportError) -> str:
        """Why the call that ended with ``error`` is not tried again ("" where it was not
        retryable)."""
        if error.status != Status.UNAVAILABLE:
            return ""
        tries = f"gave up after {self._tries} attempt{'s' if self._tries > 1 else ''}"
        if error.restarting:
            return f"still restarting after restart_patience_s = {self._patience_s:g} s; {tries}"
        return tries
