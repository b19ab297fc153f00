"""ShardFault: a shard's fail-closed latch.

When the shard can no longer vouch for its data (its write-ahead log failed
to write or fsync, or its Redis came back without the shard's marker), the
fault is tripped once, with the reason. From then on the shard refuses every
data request with :class:`ShardFailedError` (FAILED_PRECONDITION) carrying
that reason, and reports NOT_SERVING to health checks, until an operator
restarts it. Nothing resets a tripped fault.

Some faults are repaired by a restart alone: the shard rebuilds its rows from
its checkpoint and write-ahead log (its Redis restarted or lost its rows, or a
logged write's outcome in the store is unknown). Where a supervisor restarts
the process (:meth:`ShardFault.supervise`, ``--exit-on-fault``; see
:func:`~ember.ps_server.shard.shard_server.serve_until_signalled`), such a
fault ends the process, and requests meanwhile are refused as retryable
(:class:`ShardRestartingError`, UNAVAILABLE). Every other fault (a failed
fsync, a corrupt store, another process taking the shard over) needs an
operator, and one that follows a restartable fault takes its place: the
shard stays up, refusing, whatever the flag.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ember.ps_server.errors import ShardFailedError, ShardRestartingError

log = logging.getLogger(__name__)


class ShardFault:
    """The latch; see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (reason, a restart repairs it), set in one assignment: read without the lock.
        self._state: tuple[str, bool] | None = None
        self._supervised = False
        self._listeners: list[Callable[[str], None]] = []

    @property
    def reason(self) -> str | None:
        """Why the shard stopped serving, or None while it serves."""
        state = self._state
        return None if state is None else state[0]

    @property
    def restarting(self) -> bool:
        """Whether the tripped fault ends this process for its supervisor to start it again:
        every fault so far is one a restart repairs, and the process is supervised."""
        return self._ends_process(self._state)

    def _ends_process(self, state: tuple[str, bool] | None) -> bool:
        return state is not None and state[1] and self._supervised

    def supervise(self) -> None:
        """A supervisor starts this process again when it exits: a fault a restart repairs
        is answered as a restart (see the module docstring). Call it before serving.

        Raises:
            ValueError: the fault has tripped already.
        """
        with self._lock:
            if self._state is not None:
                raise ValueError("supervise() after the fault tripped")
            self._supervised = True

    def trip(self, reason: str, restartable: bool = False) -> None:
        """Stop serving for ``reason`` (the first reason is kept); tells every listener once.
        ``restartable``: a restart of the shard repairs it (it rebuilds its rows from its
        checkpoint and write-ahead log). A later fault that is not makes the tripped one
        need an operator too (its reason is added)."""
        with self._lock:
            if self._state is not None:
                first, repairable = self._state
                if repairable and not restartable:
                    self._state = (f"{first}; then: {reason}", False)
                    log.error("shard fault needs an operator now: %s", reason)
                return
            self._state = (reason, restartable)
            listeners = list(self._listeners)
        log.error("shard stopped serving: %s", reason)
        for listener in listeners:
            listener(reason)

    def on_trip(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(reason)`` when the fault trips (at once if it has)."""
        with self._lock:
            if self._state is None:
                self._listeners.append(listener)
                return
        listener(self._state[0])

    def check(self) -> None:
        """Raise if the fault has tripped: :class:`ShardRestartingError` while the process
        ends for a restart (:attr:`restarting`), else :class:`ShardFailedError`."""
        state = self._state
        if state is None:
            return
        if self._ends_process(state):  # the state read once: reason and kind agree
            raise ShardRestartingError(
                f"this shard is restarting to rebuild its rows (retry): {state[0]}"
            )
        raise ShardFailedError(f"this shard stopped serving: {state[0]}")
