"""Domain errors of the parameter server and their gRPC status codes.

The logic layers raise these; the transport maps them with
:func:`status_code_for` (the one place that knows gRPC codes) so a user sees a
precise status and a message that says what to change.
"""

from __future__ import annotations

import grpc


class EmberError(Exception):
    """Base class of errors a shard reports to its caller."""


class InvalidArgumentError(EmberError, ValueError):
    """The request is malformed (byte lengths, ids, gradients, table spec)."""


class TableNotFoundError(EmberError, KeyError):
    """The named table does not exist."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class TableExistsError(EmberError):
    """A table of that name exists with a different spec."""


class NotOwnedError(EmberError):
    """An id routed to a shard that does not own it."""


class MessageTooLargeError(EmberError):
    """A request or its reply exceeds the message limit."""


class StoreUnavailableError(EmberError):
    """The store behind a table (e.g. Redis) cannot be reached; nothing was applied."""


class StoreCorruptError(EmberError):
    """The store holds a value Ember cannot read (another format or table layout)."""


class DurableFileCorruptError(StoreCorruptError):
    """A checkpoint or write-log file fails its checksum or is cut short."""


class CheckpointStateError(EmberError):
    """A checkpoint step out of order: no pause, an expired lease, a wrong base, a spec clash."""


class ShardFailedError(EmberError):
    """The shard stopped serving to protect its data (see ``ShardFault``); restart it."""


class DurableStateError(EmberError):
    """Durable state (a write-ahead log, a Redis database) does not fit this shard's start."""


class TopologyMismatchError(DurableStateError):
    """Durable state (a write-ahead log, a Redis database) belongs to another shard count."""


class WriteLogLockedError(EmberError):
    """Another live process holds this shard's write-ahead log."""


class ClockTimeoutError(EmberError):
    """A request waited past its deadline for other ranks of its job (named in the message)."""


class PermissionDeniedError(EmberError):
    """A control request names something outside what this shard may touch."""


class ReplicaReleasedError(EmberError):
    """A training job that released its hot-row replicas says it holds them again."""


class TooManyJobsError(EmberError):
    """The shard already tracks as many jobs of a kind as it keeps."""


_STATUS_CODES: dict[type[EmberError], grpc.StatusCode] = {
    InvalidArgumentError: grpc.StatusCode.INVALID_ARGUMENT,
    TableNotFoundError: grpc.StatusCode.NOT_FOUND,
    TableExistsError: grpc.StatusCode.ALREADY_EXISTS,
    NotOwnedError: grpc.StatusCode.FAILED_PRECONDITION,
    MessageTooLargeError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    StoreUnavailableError: grpc.StatusCode.UNAVAILABLE,
    StoreCorruptError: grpc.StatusCode.DATA_LOSS,
    CheckpointStateError: grpc.StatusCode.FAILED_PRECONDITION,
    ShardFailedError: grpc.StatusCode.FAILED_PRECONDITION,
    DurableStateError: grpc.StatusCode.FAILED_PRECONDITION,
    WriteLogLockedError: grpc.StatusCode.FAILED_PRECONDITION,
    PermissionDeniedError: grpc.StatusCode.PERMISSION_DENIED,
    ClockTimeoutError: grpc.StatusCode.DEADLINE_EXCEEDED,
    TooManyJobsError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ReplicaReleasedError: grpc.StatusCode.FAILED_PRECONDITION,
}


def status_code_for(error: EmberError) -> grpc.StatusCode:
    """The gRPC status code that reports ``error``."""
    for cls in type(error).__mro__:
        if cls in _STATUS_CODES:
            return _STATUS_CODES[cls]
    return grpc.StatusCode.INTERNAL


class PSClientError(RuntimeError):
    """A shard answered a client request with an error, or could not be reached.

    Attributes:
        endpoint: the shard's ``host:port``.
        code: the gRPC status code.
        details: the shard's message.
    """

    def __init__(self, endpoint: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"shard {endpoint}: {code.name}: {details}")
        self.endpoint = endpoint
        self.code = code
        self.details = details
