"""CallWatch: whether the caller of a request a shard serves is still there.

A request that waits for a clock holds a wait slot and a worker thread. When
its caller goes away (it cancelled the call, its deadline passed, its
connection closed), the transport ends the watch and the wait gives up at
once, rather than at its own deadline, for an answer nobody would read.
"""

from __future__ import annotations

import concurrent.futures
import threading

# Wakes waits whose caller went away. The transport ends a watch on its own thread (gRPC:
# the server's one event-loop thread), which must not block on a job's condition: a
# write holds it while it logs and stores.
_WAKER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ember-call-ended")


class CallWatch:
    """Ended by the transport when the caller is gone; waits watch it on their condition."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ended = False
        self._conditions: list[threading.Condition] = []

    @property
    def ended(self) -> bool:
        """Whether :meth:`end` was called."""
        return self._ended

    def end(self) -> None:
        """The caller is gone: wake every wait watching this call (on another thread)."""
        with self._lock:
            self._ended = True
            conditions = list(self._conditions)
        if conditions:
            _WAKER.submit(_notify, conditions)

    def watch(self, cond: threading.Condition) -> None:
        """Wake waiters on ``cond`` (held by the caller) when the call ends."""
        with self._lock:
            self._conditions.append(cond)

    def unwatch(self, cond: threading.Condition) -> None:
        """Undo :meth:`watch`."""
        with self._lock:
            self._conditions.remove(cond)


def _notify(conditions: list[threading.Condition]) -> None:
    for cond in conditions:
        with cond:
            cond.notify_all()
