"""How far a starting shard's recovery has got: said in the refusals it answers meanwhile
and, during a long log replay, in its log."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# How often a long replay says how far it is.
LOG_EVERY_S = 10.0
# Records replayed between two looks at the clock (each costs about as much as telling).
CLOCK_EVERY = 1024


class RecoveryProgress:
    """What recovery is doing now. Recovery writes it on one thread; request threads read
    :meth:`describe` (the state is one tuple, replaced whole).

    Args:
        clock: seconds, monotonic (when to log a long replay's progress).

    Example:
        >>> progress = RecoveryProgress()
        >>> progress.stage("verifying its log")
        >>> progress.describe()
        'verifying its log'
        >>> progress.replayed(1_500, 6_000)
        >>> progress.describe()
        'replaying its log: 1,500 of 6,000 records (25%)'
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._state: tuple[str, int, int] = ("starting", 0, 0)
        self._next_log = 0.0

    def stage(self, what: str) -> None:
        """Recovery begins ``what`` (a phrase: "verifying its log")."""
        self._state = (what, 0, 0)

    def replayed(self, done: int, total: int) -> None:
        """``done`` of the log's ``total`` records are applied again."""
        self._state = ("replaying its log", done, total)
        if done % CLOCK_EVERY:
            return
        now = self._clock()
        if done == 0:
            self._next_log = now + LOG_EVERY_S
        elif now >= self._next_log:
            self._next_log = now + LOG_EVERY_S
            log.info("recovery: %s", self.describe())

    def describe(self) -> str:
        """What recovery is doing, as a phrase."""
        what, done, total = self._state
        if not total:
            return what
        return f"{what}: {done:,} of {total:,} records ({100 * done // total}%)"
