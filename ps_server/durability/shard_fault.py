"""ShardFault: a shard's fail-closed latch.

When the shard can no longer vouch for its data (its write-ahead log failed
to write or fsync, or its Redis came back without the shard's marker), the
fault is tripped once, with the reason. From then on the shard refuses every
data request with :class:`ShardFailedError` (FAILED_PRECONDITION) carrying
that reason, and reports NOT_SERVING to health checks, until an operator
restarts it. Nothing resets a tripped fault.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ember.ps_server.errors import ShardFailedError

log = logging.getLogger(__name__)


class ShardFault:
    """The latch; see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._listeners: list[Callable[[str], None]] = []

    @property
    def reason(self) -> str | None:
        """Why the shard stopped serving, or None while it serves."""
        return self._reason

    def trip(self, reason: str) -> None:
        """Stop serving for ``reason`` (the first reason is kept); tells every listener once."""
        with self._lock:
            if self._reason is not None:
                return
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
        """Raise :class:`ShardFailedError` if the fault has tripped."""
        if self._reason is not None:
            raise ShardFailedError(f"this shard stopped serving: {self._reason}")
