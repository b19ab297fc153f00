"""Zero-copy codecs for the data-path messages, byte-identical to protobuf.

Pull replies and push requests carry megabytes of packed rows. The generated
protobuf classes copy such a payload several times (into the message arena,
out to a Python ``bytes`` on access, again to serialise). These codecs read
and write the same proto3 wire format directly: decoding returns memoryviews
into the received buffer and encoding joins the payload into the message in
one copy. Any protobuf client of ember.v1 stays compatible; the tests check
both directions against the generated classes.
"""

from __future__ import annotations

import dataclasses

from ember.ps_server.wire.proto_wire import (
    EMPTY,
    LEN,
    VARINT,
    Buffer,
    bytes_view,
    fields,
    len_field,
    uint32,
    utf8,
    varint,
)


@dataclasses.dataclass
class PullReplyView:
    """A decoded PullResponse whose payloads are views into the received bytes."""

    values: memoryview
    versions: memoryview
    dim: int
    state: memoryview


@dataclasses.dataclass
class PushRequestView:
    """A decoded PushRequest whose payloads are views into the received bytes."""

    table: str
    ids: memoryview
    grads: memoryview
    request_id: str


def encode_pull_reply(values: Buffer, versions: Buffer, dim: int, state: Buffer = b"") -> bytes:
    """Serialise a PullResponse (values=1, versions=2, dim=3, state=4) from C-contiguous buffers."""
    values, versions, state = bytes_view(values), bytes_view(versions), bytes_view(state)
    parts = [
        len_field(1, len(values)), values,
        len_field(2, len(versions)), versions,
        varint(3 << 3), varint(dim),
    ]  # fmt: skip
    if len(state):
        parts += [len_field(4, len(state)), state]
    return b"".join(parts)


def decode_pull_reply(data: bytes) -> PullReplyView:
    """Parse a serialised PullResponse without copying its payloads."""
    reply = PullReplyView(values=EMPTY, versions=EMPTY, dim=0, state=EMPTY)
    for number, wire_type, value in fields(memoryview(data)):
        if number == 1 and wire_type == LEN:
            reply.values = value
        elif number == 2 and wire_type == LEN:
            reply.versions = value
        elif number == 4 and wire_type == LEN:
            reply.state = value
        elif number == 3 and wire_type == VARINT:
            reply.dim = uint32(value)
    return reply


def encode_push_request(table: str, ids: Buffer, grads: Buffer, request_id: str) -> bytes:
    """Serialise a PushRequest (table=1, ids=2, grads=3, request_id=4) from C-contiguous buffers."""
    ids, grads = bytes_view(ids), bytes_view(grads)
    name, rid = table.encode(), request_id.encode()
    return b"".join(
        (
            len_field(1, len(name)), name,
            len_field(2, len(ids)), ids,
            len_field(3, len(grads)), grads,
            len_field(4, len(rid)), rid,
        )
    )  # fmt: skip


def push_log_record(requests: list[tuple[str, Buffer, Buffer, str]]) -> list[memoryview | bytes]:
    """A ``LogRecord{push: PushBatchRequest{requests}}`` as buffers whose concatenation is it.

    The ids and gradients are referenced, not copied, so a write-ahead log
    writes them straight from the request.
    """
    batch: list[memoryview | bytes] = []
    for table, ids, grads, request_id in requests:
        ids, grads = bytes_view(ids), bytes_view(grads)
        name, rid = table.encode(), request_id.encode()
        fields = [
            len_field(1, len(name)), name,
            len_field(2, len(ids)), ids,
            len_field(3, len(grads)), grads,
            len_field(4, len(rid)), rid,
        ]  # fmt: skip
        batch += [len_field(1, sum(len(part) for part in fields)), *fields]
    return [len_field(2, sum(len(part) for part in batch)), *batch]


def decode_push_request(data: bytes) -> PushRequestView:
    """Parse a serialised PushRequest without copying its payloads."""
    request = PushRequestView(table="", ids=EMPTY, grads=EMPTY, request_id="")
    for number, wire_type, value in fields(memoryview(data)):
        if wire_type != LEN:
            continue
        if number == 1:
            request.table = utf8(value, "table")
        elif number == 2:
            request.ids = value
        elif number == 3:
            request.grads = value
        elif number == 4:
            request.request_id = utf8(value, "request_id")
    return request
