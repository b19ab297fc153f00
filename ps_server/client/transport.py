"""The seam between the client and its transports: one call to one shard, and its failure.

gRPC carries every call; a data plane (gRPC itself, or UCX) carries the
step calls, Lookup and Update, chosen by one string (:data:`TRANSPORTS`).
A transport turns its own failures into :class:`TransportError` with a
:class:`Status`, so that retries and the errors a user sees are the same
whichever transport carried the call.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from ember.ps_server.errors import Status
from ember.ps_server.wire.frames import NO_CLOCK
from ember.ps_server.wire.row_dtype import RowDtype

TRANSPORTS = ("grpc", "ucx", "auto")
STEP_METHODS = frozenset({"Lookup", "Update"})


@dataclasses.dataclass(frozen=True)
class ShardCall:
    """One call: the shard's index, the method name and the request.

    Attributes:
        extra_wait_s: added to the configured deadline (for a request the shard may
            hold that long).
        tables: tables in a step request (its frame header repeats them).
        clock: the step clock a step request carries (:data:`NO_CLOCK`: none).
        dtype: how a step request's rows travel (see :func:`frames.frame_dtype`).
    """

    shard: int
    method: str
    request: Any
    extra_wait_s: float = 0.0
    tables: int = 0
    clock: int = NO_CLOCK
    dtype: int = RowDtype.FLOAT32


class TransportError(Exception):
    """A call that failed: its status and the shard's (or the transport's) message.

    Attributes:
        restarting: the shard answered that it is restarting (UNAVAILABLE): it exits for its
            supervisor, or is rebuilding its rows, and serves again after that.
    """

    def __init__(self, status: Status, details: str, restarting: bool = False) -> None:
        super().__init__(f"{status.name}: {details}")
        self.status = status
        self.details = details
        self.restarting = restarting


class Transport(Protocol):
    """What carries calls to the shards."""

    name: str
    # Appended to every step message this transport sends (its framing's end mark).
    trailer: bytes

    def call(self, call: ShardCall, timeout_s: float) -> Any:
        """The decoded reply of ``call``.

        Raises:
            TransportError: the shard refused the call, or could not be reached
                (UNAVAILABLE: the call may be retried).
        """
        ...

    def close(self) -> None:
        """Release connections and threads."""
        ...


def check_transport(name: str) -> None:
    """Raise ValueError unless ``name`` is one of :data:`TRANSPORTS`."""
    if name not in TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {name!r}")
