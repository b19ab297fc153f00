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
the process (:meth:`ShardFault.supervise`, ``--exit-on-fault``), such a fault
ends the process, and requests meanwhile are refused as retryable
(:class:`ShardRestartingError`, UNAVAILABLE). Every other fault
(a failed fsync, another process taking the shard over) needs an operator: the
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
        self._reason: str | None = None
        self._restartable = False
        self._supervised = False
        self._listeners: list[Callable[[str], None]] = []

    @property
    def reason(self) -> str | None:
        """Why the shard stopped serving, or None while it serves."""
        return self._reason

    @property
    def restarting(self) -> bool:
        """Whether the tripped fault ends this process for its supervisor to start it again:
        the fault is one a restart repairs, and the process is :meth:`supervise`\\ d."""
        return self._reason is not None and self._restartable and self._supervised

    def supervise(self) -> None:
        """A supervisor starts this process again when it exits: a fault a restart repairs
        is answered as a restart (see the module docstring). Call it before serving."""
        self._supervised = True

    def trip(self, reason: str, restartable: bool = False) -> None:
        """Stop serving for ``reason`` (the first reason is kept); tells every listener once.
        ``restartable``: a restart of the shard repairs it (it rebuilds its rows from its
        checkpoint and write-ahead log)."""
        with self._lock:
            if self._reason is not None:
                return
            self._restartable = restartable  # before the reason: check() reads them unlocked
            self._reason = reason
            listeners = list(self._listeners)
        log.error("shard stopped serving: %s", reason)
        for listener in listeners:
            listener(reason)

    def on_trip(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(reason)`` when the fault trips (at once if it has)."""
        with self._lock:
            if self._reason is None:
                self._listeners.append(listener)
                return
        listener(self._reason)

    def check(self) -> None:
        """Raise if the fault has tripped: :class:`ShardRestartingError` while the process
        ends for a restart (:attr:`restarting`), else :class:`ShardFailedError`."""
        if self._reason is None:
            return
        if self.restarting:
            raise ShardRestartingError(
                f"this shard is restarting to rebuild its rows (retry): {self._reason}"
            )
        raise ShardFailedError(f"this shard stopped serving: {self._reason}")
