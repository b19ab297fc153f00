"""Frames of the UCX data plane: a fixed header, then the step message's bytes.

A call is two UCX tag messages on one endpoint, each way: a header of
:data:`HEADER_BYTES`, then a payload of exactly ``payload_bytes``. The payload
is the same serialised LookupRequest / UpdateRequest (and replies) that gRPC
carries, followed by :data:`END_MARK`; an error reply's payload is its UTF-8
message and the mark. The header ends with the mark too. The Python bindings tell a
receiver neither that a message was shorter than its buffer nor how long it was, so
the receiver zeroes the buffer's last bytes before receiving: a header or
payload shorter than it should be leaves them zero and is refused (one longer
fails in UCX as truncated).

The header repeats what the payload says (table count, clock, the rows'
dtype) so that a shard can refuse a frame whose header disagrees with its
message.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from collections.abc import Iterable

from ember.ps_server.errors import InvalidArgumentError, MessageTooLargeError, Status
from ember.ps_server.wire.row_dtype import RowDtype

MAGIC = b"EMBF"
VERSION = 1
END_MARK = b"EMBE"
NO_CLOCK = -1
# magic, version, op, status, dtype, tables, payload bytes, clock, request id, end mark
_HEADER = struct.Struct("<4sBBBBIQqQ4s")
# The restart mark, a bit of the status byte. In a request: the caller reads the mark (a
# shard from before it refuses such a request: upgrade shards before trainers). In an
# UNAVAILABLE reply to such a request: the shard is restarting (gRPC says so in trailing
# metadata: see messages.RESTARTING_KEY). A caller that does not set it is never sent it.
RESTART_MARK = 0x80
HEADER_BYTES = _HEADER.size


class Op(enum.IntEnum):
    """What a frame asks for (a reply carries its request's op)."""

    LOOKUP = 1
    UPDATE = 2
    # The first frame of a connection to a listener that requires the cluster's token: its
    # message is the token as gRPC carries it ("Bearer <token>"); answered OK or
    # UNAUTHENTICATED (then the listener closes the connection).
    HELLO = 3


# The largest HELLO message a listener reads.
MAX_HELLO_BYTES = 1024


# A header's dtype when the message's tables travel in different dtypes.
MIXED_DTYPES = 255


def frame_dtype(dtypes: Iterable[int]) -> int:
    """A header's dtype for a message whose row entries travel in ``dtypes``: the one they
    share (float32 when there are none), else :data:`MIXED_DTYPES`."""
    distinct = set(dtypes)
    if len(distinct) > 1:
        return MIXED_DTYPES
    return int(distinct.pop()) if distinct else int(RowDtype.FLOAT32)


class FrameError(InvalidArgumentError):
    """A frame that cannot be read: the stream it came on is no longer trusted."""


class FrameTooLargeError(MessageTooLargeError, FrameError):
    """A frame whose payload is over the receiver's limit (RESOURCE_EXHAUSTED, as gRPC
    reports it); its payload is not read, so the stream is no longer trusted either."""


@dataclasses.dataclass(frozen=True)
class FrameHeader:
    """The fixed part of a frame.

    Attributes:
        op: what the frame asks for, or answers.
        request_id: chosen by the caller; a reply carries its request's.
        payload_bytes: bytes of the payload message that follows, end mark included.
        tables: tables in the payload's message (0 in a reply).
        clock: the step clock the message carries (:data:`NO_CLOCK`: none).
        dtype: how the message's rows travel (see :func:`frame_dtype`); a reply echoes its
            request's (an Update's refreshed rows say their own dtype in the message).
        status: OK in requests; a reply's outcome.
        restart_mark: in a request, the caller reads the mark; in an UNAVAILABLE reply, the
            shard is restarting (it exits for its supervisor, or is rebuilding its rows), so
            the caller waits longer for it (see :data:`RESTART_MARK`).
    """

    op: Op
    request_id: int
    payload_bytes: int
    tables: int = 0
    clock: int = NO_CLOCK
    dtype: int = RowDtype.FLOAT32
    status: Status = Status.OK
    restart_mark: bool = False

    def __post_init__(self) -> None:
        if self.restart_mark and self.status not in (Status.OK, Status.UNAVAILABLE):
            raise ValueError(f"a {self.status.name} frame cannot carry the restart mark")

    def encode(self) -> bytes:
        """The header's bytes."""
        status = self.status | (RESTART_MARK if self.restart_mark else 0)
        return _HEADER.pack(
            MAGIC, VERSION, self.op, status, self.dtype, self.tables,
            self.payload_bytes, self.clock, self.request_id, END_MARK,
        )  # fmt: skip

    @classmethod
    def decode(
        cls, data: bytes | memoryview, max_payload_bytes: int, request: bool = False
    ) -> FrameHeader:
        """Read a header, refusing any field out of range before a payload is allocated;
        ``request``: it asks for something, so its status must be OK.

        Raises:
            FrameError: naming the first bad field.
        """
        if len(data) != HEADER_BYTES:
            raise FrameError(f"a frame header is {HEADER_BYTES} bytes, got {len(data)}")
        magic, version, op, status, dtype, tables, size, clock, request_id, end = _HEADER.unpack(
            data
        )
        if magic != MAGIC:
            raise FrameError(f"not an Ember frame: magic {magic!r}")
        if end != END_MARK:
            raise FrameError("frame header cut short (no end mark)")
        if version != VERSION:
            raise FrameError(f"frame version {version} is not {VERSION}")
        if op not in Op._value2member_map_:
            raise FrameError(f"unknown frame op {op}")
        restart_mark = bool(status & RESTART_MARK)
        status &= ~RESTART_MARK
        if status not in Status._value2member_map_:
            raise FrameError(f"unknown status {status}")
        if request and status != Status.OK:
            raise FrameError(f"a request carries status {Status(status).name}, not OK")
        if restart_mark and status != (Status.OK if request else Status.UNAVAILABLE):
            raise FrameError(
                f"a frame of status {Status(status).name} carries the restart mark (only a "
                "request, OK, or an UNAVAILABLE reply may)"
            )
        if dtype not in RowDtype._value2member_map_ and dtype != MIXED_DTYPES:
            raise FrameError(f"unknown row dtype {dtype}")
        if not len(END_MARK) <= size <= max_payload_bytes:
            too_large = FrameTooLargeError if size > max_payload_bytes else FrameError
            raise too_large(
                f"payload of {size} bytes is outside {len(END_MARK)}..{max_payload_bytes}"
            )
        if clock < NO_CLOCK:
            raise FrameError(f"clock must be >= 0 (or {NO_CLOCK}: none), got {clock}")
        return cls(Op(op), request_id, size, tables, clock, dtype, Status(status), restart_mark)


def payload_body(payload: memoryview) -> memoryview:
    """The message in a received ``payload``, without its end mark.

    Raises:
        FrameError: the payload does not end with the mark (it was cut short).
    """
    if bytes(payload[-len(END_MARK) :]) != END_MARK:
        raise FrameError("payload shorter than its header says (no end mark)")
    return payload[: -len(END_MARK)]


def check_header_matches(
    header: FrameHeader, tables: int, clock: int | None, dtypes: Iterable[int]
) -> None:
    """Refuse a request whose header disagrees with its message (``dtypes``: of its row
    entries).

    Raises:
        InvalidArgumentError: the table count, the clock or the dtype differs.
    """
    if header.tables != tables:
        raise InvalidArgumentError(
            f"frame header names {header.tables} tables, its message {tables}"
        )
    message_clock = NO_CLOCK if clock is None else clock
    if header.clock != message_clock:
        raise InvalidArgumentError(
            f"frame header carries clock {header.clock}, its message {message_clock}"
        )
    message_dtype = frame_dtype(dtypes)
    if header.dtype != message_dtype:
        raise InvalidArgumentError(
            f"frame header carries dtype {_dtype_name(header.dtype)}, its message "
            f"{_dtype_name(message_dtype)}"
        )


def _dtype_name(dtype: int) -> str:
    if dtype == MIXED_DTYPES:
        return "mixed"
    known = RowDtype._value2member_map_.get(dtype)
    return known.name.lower() if known is not None else f"{dtype} (unknown)"
