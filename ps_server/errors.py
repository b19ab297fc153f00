"""Domain errors of the parameter server and the status each one reports.

The logic layers raise these; every transport reports one with the status
:func:`status_for` gives (gRPC as its own status code of that number, UCX in
its frame header), so a user sees the same precise status and a message that
says what to change whichever transport carried the call.
"""

from __future__ import annotations

import enum


class Status(enum.IntEnum):
    """The canonical status codes, numbered as gRPC numbers them."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class EmberError(Exception):
    """Base class of errors a shard reports to its caller."""


class InvalidArgumentError(EmberError, ValueError):
    """The request is malformed (byte lengths, ids, gradients, table spec)."""


class OutOfRangeError(EmberError, ValueError):
    """A value the request asks to send cannot be represented as asked (a row beyond float16)."""


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


class ClockTooLargeError(MessageTooLargeError):
    """An exact-mode clock's summed update is larger than one write-ahead log record holds."""


class StoreUnavailableError(EmberError):
    """The store behind a table (e.g. Redis) cannot be reached; nothing was applied."""


class StoreWriteUnknownError(StoreUnavailableError):
    """The store's connection failed while a write was in flight: it may have been applied
    (a logged write then stops the shard, whose restart rebuilds the store from its log)."""


class StoreCorruptError(EmberError):
    """The store holds a value Ember cannot read (another format or table layout)."""


class DurableFileCorruptError(StoreCorruptError):
    """A checkpoint or write-log file fails its checksum or is cut short."""


class CheckpointStateError(EmberError):
    """A checkpoint step out of order: no pause, an expired lease, a wrong base, a spec clash."""


class ShardFailedError(EmberError):
    """The shard stopped serving to protect its data (see ``ShardFault``); restart it."""


class ShardRestartingError(ShardFailedError):
    """The shard stopped serving on a fault its restart repairs, and its process ends for its
    supervisor to start it again (``--exit-on-fault``): retry. Both transports mark it as a
    restart's (see :data:`~ember.ps_server.wire.messages.RESTARTING_KEY`), and clients wait
    for such a shard longer (``restart_patience_s``)."""


class ShardRecoveringError(ShardRestartingError):
    """The shard's process is rebuilding its rows (checkpoint, write-ahead log) before it
    serves: retry, as for a restart (it has not failed; nothing needs restarting)."""


class DurableStateError(EmberError):
    """Durable state (a write-ahead log, a Redis database) does not fit this shard's start."""


class TopologyMismatchError(DurableStateError):
    """Durable state (a write-ahead log, a Redis database) belongs to another shard count."""


class WriteLogLockedError(EmberError):
    """Another live process holds this shard's write-ahead log."""


class ShardStoppingError(EmberError):
    """The shard is shutting down and takes no new request (retry it elsewhere or later)."""


class ClockTimeoutError(EmberError):
    """A request waited past its deadline for other ranks of its job (named in the message)."""


class CallEndedError(EmberError):
    """The caller of a request that waited for a clock is gone (it cancelled the call, its
    deadline passed, or its connection closed): the wait ends, as if timed out."""


class SupersededError(EmberError):
    """A retry of the same update (its client gave up on this attempt) took over its wait."""


class PermissionDeniedError(EmberError):
    """A control request names something outside what this shard may touch."""


class ReplicaReleasedError(EmberError):
    """A training job that released its hot-row replicas says it holds them again."""


class TooManyJobsError(EmberError):
    """The shard already tracks as many jobs of a kind as it keeps."""


class TooManyWaitingError(EmberError):
    """As many requests wait on the shard (for clocks, or held write-back reports) as it
    lets wait, or as many checkpoints ask for write-backs as it lets ask: each holds a
    worker thread, and the rest are kept for calls that never wait."""


class UnauthenticatedError(EmberError):
    """A caller without the cluster's token (a UCX connection that did not present it)."""


_STATUSES: dict[type[EmberError], Status] = {
    InvalidArgumentError: Status.INVALID_ARGUMENT,
    OutOfRangeError: Status.OUT_OF_RANGE,
    TableNotFoundError: Status.NOT_FOUND,
    TableExistsError: Status.ALREADY_EXISTS,
    NotOwnedError: Status.FAILED_PRECONDITION,
    MessageTooLargeError: Status.RESOURCE_EXHAUSTED,
    StoreUnavailableError: Status.UNAVAILABLE,
    StoreCorruptError: Status.DATA_LOSS,
    CheckpointStateError: Status.FAILED_PRECONDITION,
    ShardFailedError: Status.FAILED_PRECONDITION,
    ShardRestartingError: Status.UNAVAILABLE,
    DurableStateError: Status.FAILED_PRECONDITION,
    WriteLogLockedError: Status.FAILED_PRECONDITION,
    PermissionDeniedError: Status.PERMISSION_DENIED,
    ClockTimeoutError: Status.DEADLINE_EXCEEDED,
    CallEndedError: Status.CANCELLED,
    SupersededError: Status.ABORTED,
    ShardStoppingError: Status.UNAVAILABLE,
    TooManyJobsError: Status.RESOURCE_EXHAUSTED,
    TooManyWaitingError: Status.RESOURCE_EXHAUSTED,
    ReplicaReleasedError: Status.FAILED_PRECONDITION,
    UnauthenticatedError: Status.UNAUTHENTICATED,
}


def marks_restart(error: BaseException) -> bool:
    """Whether a refusal with ``error`` says that the shard is restarting (both transports
    mark it beside the status, UNAVAILABLE, so that clients wait longer for the shard)."""
    return isinstance(error, ShardRestartingError)


def status_for(error: EmberError) -> Status:
    """The status that reports ``error``."""
    for cls in type(error).__mro__:
        if cls in _STATUSES:
            return _STATUSES[cls]
    return Status.INTERNAL


class PSClientError(RuntimeError):
    """A shard answered a client request with an error, or could not be reached.

    Attributes:
        endpoint: the shard's ``host:port``.
        code: the status, the same over every transport.
        details: the shard's message.
    """

    def __init__(self, endpoint: str, code: Status, details: str) -> None:
        super().__init__(f"shard {endpoint}: {code.name}: {details}")
        self.endpoint = endpoint
        self.code = code
        self.details = details
