"""How a shard's requests wait on a condition: in one of a bounded number of wait slots,
until their deadline, and no longer than their caller is there.

Each waiting request holds a worker thread, so the slots (shared by every kind of
wait on the shard: clocks, replica flushes) keep the rest free for calls that
never wait: other ranks' updates, health checks, checkpoints.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from ember.ps_server.errors import CallEndedError, TooManyWaitingError
from ember.ps_server.shard.call_watch import CallWatch


class WaitSlots:
    """How many requests may wait at once, over everything a shard waits for (None: no
    limit)."""

    def __init__(self, limit: int | None = None) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"the wait limit must be >= 1, got {limit}")
        self.limit = limit
        self._lock = threading.Lock()
        self._taken = 0

    def take(self, what: str) -> None:
        """Take a slot for a request about to wait for ``what``.

        Raises:
            TooManyWaitingError: every slot is taken (the request does not wait).
        """
        with self._lock:
            if self.limit is not None and self._taken >= self.limit:
                raise TooManyWaitingError(
                    f"not waiting for {what}: {self._taken} requests already wait on this "
                    f"shard, its limit ({self.limit}: --workers less a quarter, at least 3, as "
                    "each waiting request holds a worker thread). A rank may be far behind; else "
                    "give shards --workers of at least N x 4/3 and N + 3, N = ranks x "
                    "(staleness + 2) + replica jobs"
                )
            self._taken += 1

    @property
    def taken(self) -> int:
        """Slots taken now."""
        return self._taken

    def give(self) -> None:
        """Return a slot :meth:`take` gave."""
        with self._lock:
            self._taken -= 1

    @contextlib.contextmanager
    def holding(self, what: str) -> Iterator[None]:
        """A slot (see :meth:`take`) for the block."""
        self.take(what)
        try:
            yield
        finally:
            self.give()


def wait_until(
    cond: threading.Condition,
    ready: Callable[[], bool],
    deadline: float,
    what: str,
    call: CallWatch | None = None,
) -> bool:
    """Wait on ``cond`` (held by the caller) until ``ready()`` (True) or the monotonic
    ``deadline`` (False), for as long as ``call``'s caller is there (None: a caller the
    shard cannot watch).

    Raises:
        CallEndedError: the caller went away first.
    """
    if call is not None:
        call.watch(cond)
    try:
        while not ready():
            if call is not None and call.ended:
                raise CallEndedError(f"the caller waiting for {what} went away")
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not cond.wait(remaining):
                return ready()
        return True
    finally:
        if call is not None:
            call.unwatch(cond)
