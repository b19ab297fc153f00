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
from collections.abc import Iterator

import numpy as np
from ember.ps_server.errors import InvalidArgumentError

_VARINT, _FIXED64, _LEN, _START_GROUP, _END_GROUP, _FIXED32 = 0, 1, 2, 3, 4, 5
_MAX_FIELD_NUMBER = (1 << 29) - 1
_MAX_GROUP_DEPTH = 100  # protobuf's default nesting limit
_VARINT_BYTES = 10
_TAG_AND_LENGTH_BYTES = 5  # protobuf reads tags and lengths as 32-bit varints


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _malformed(what: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"malformed message: {what}")


def _read_varint(data: memoryview, pos: int, max_bytes: int = _VARINT_BYTES) -> tuple[int, int]:
    """A varint of at most ``max_bytes`` bytes; bits past 64 are dropped, as protobuf drops
    them."""
    result = 0
    for index in range(max_bytes):
        if pos >= len(data):
            raise _malformed("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << (7 * index)
        if not byte & 0x80:
            return result & 0xFFFF_FFFF_FFFF_FFFF, pos
    raise _malformed(f"varint longer than {max_bytes} bytes")


def _field(data: memoryview, pos: int, depth: int) -> tuple[int, int, int | memoryview, int]:
    """``(number, wire type, value, next position)`` of the field at ``pos``; a group's value
    is its bytes, an end-group's None. Rejects exactly what protobuf's parser rejects."""
    key, pos = _read_varint(data, pos, _TAG_AND_LENGTH_BYTES)
    number, wire_type = key >> 3, key & 7
    if not 0 < number <= _MAX_FIELD_NUMBER:
        raise _malformed(f"field number {number}")
    if wire_type == _VARINT:
        value, pos = _read_varint(data, pos)
    elif wire_type == _LEN:
        length, pos = _read_varint(data, pos, _TAG_AND_LENGTH_BYTES)
        if length > len(data) - pos:
            raise _malformed("field runs past the end")
        value, pos = data[pos : pos + length], pos + length
    elif wire_type in (_FIXED64, _FIXED32):
        width = 8 if wire_type == _FIXED64 else 4
        if width > len(data) - pos:
            raise _malformed("truncated fixed-width field")
        value, pos = int.from_bytes(data[pos : pos + width], "little"), pos + width
    elif wire_type == _START_GROUP:
        if depth >= _MAX_GROUP_DEPTH:
            raise _malformed("groups nested too deeply")
        start = pos
        while True:
            if pos >= len(data):
                raise _malformed(f"group {number} is not closed")
            inner, inner_type, _, pos = _field(data, pos, depth + 1)
            if inner_type == _END_GROUP:
                if inner != number:
                    raise _malformed(f"group {number} closed as group {inner}")
                break
        value = data[start:pos]
    elif wire_type == _END_GROUP:
        value = None
    else:
        raise _malformed(f"unsupported wire type {wire_type}")
    return number, wire_type, value, pos


def _fields(data: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) of every field; LEN values are memoryviews."""
    pos = 0
    while pos < len(data):
        number, wire_type, value, pos = _field(data, pos, depth=0)
        if wire_type == _END_GROUP:
            raise _malformed(f"group {number} closed but never opened")
        yield number, wire_type, value


def _uint32(value: int) -> int:
    """A varint read as protobuf reads a ``uint32``: its low 32 bits."""
    return value & 0xFFFF_FFFF


def _len_field(number: int, payload_length: int) -> bytes:
    return _varint((number << 3) | _LEN) + _varint(payload_length)


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


_EMPTY = memoryview(b"")
Buffer = bytes | memoryview | np.ndarray


def _bytes_view(buffer: Buffer) -> memoryview:
    view = memoryview(buffer)
    return view.cast("B") if view.nbytes else _EMPTY


def encode_pull_reply(values: Buffer, versions: Buffer, dim: int, state: Buffer = b"") -> bytes:
    """Serialise a PullResponse (values=1, versions=2, dim=3, state=4) from C-contiguous buffers."""
    values, versions, state = _bytes_view(values), _bytes_view(versions), _bytes_view(state)
    parts = [
        _len_field(1, len(values)), values,
        _len_field(2, len(versions)), versions,
        _varint(3 << 3), _varint(dim),
    ]  # fmt: skip
    if len(state):
        parts += [_len_field(4, len(state)), state]
    return b"".join(parts)


def decode_pull_reply(data: bytes) -> PullReplyView:
    """Parse a serialised PullResponse without copying its payloads."""
    reply = PullReplyView(values=_EMPTY, versions=_EMPTY, dim=0, state=_EMPTY)
    for number, wire_type, value in _fields(memoryview(data)):
        if number == 1 and wire_type == _LEN:
            reply.values = value
        elif number == 2 and wire_type == _LEN:
            reply.versions = value
        elif number == 4 and wire_type == _LEN:
            reply.state = value
        elif number == 3 and wire_type == _VARINT:
            reply.dim = _uint32(value)
    return reply


def encode_push_request(table: str, ids: Buffer, grads: Buffer, request_id: str) -> bytes:
    """Serialise a PushRequest (table=1, ids=2, grads=3, request_id=4) from C-contiguous buffers."""
    ids, grads = _bytes_view(ids), _bytes_view(grads)
    name, rid = table.encode(), request_id.encode()
    return b"".join(
        (
            _len_field(1, len(name)), name,
            _len_field(2, len(ids)), ids,
            _len_field(3, len(grads)), grads,
            _len_field(4, len(rid)), rid,
        )
    )  # fmt: skip


def push_log_record(requests: list[tuple[str, Buffer, Buffer, str]]) -> list[memoryview | bytes]:
    """A ``LogRecord{push: PushBatchRequest{requests}}`` as buffers whose concatenation is it.

    The ids and gradients are referenced, not copied, so a write-ahead log
    writes them straight from the request.
    """
    batch: list[memoryview | bytes] = []
    for table, ids, grads, request_id in requests:
        ids, grads = _bytes_view(ids), _bytes_view(grads)
        name, rid = table.encode(), request_id.encode()
        fields = [
            _len_field(1, len(name)), name,
            _len_field(2, len(ids)), ids,
            _len_field(3, len(grads)), grads,
            _len_field(4, len(rid)), rid,
        ]  # fmt: skip
        batch += [_len_field(1, sum(len(part) for part in fields)), *fields]
    return [_len_field(2, sum(len(part) for part in batch)), *batch]


def decode_push_request(data: bytes) -> PushRequestView:
    """Parse a serialised PushRequest without copying its payloads."""
    request = PushRequestView(table="", ids=_EMPTY, grads=_EMPTY, request_id="")
    for number, wire_type, value in _fields(memoryview(data)):
        if wire_type != _LEN:
            continue
        if number == 1:
            request.table = _utf8(value, "table")
        elif number == 2:
            request.ids = value
        elif number == 3:
            request.grads = value
        elif number == 4:
            request.request_id = _utf8(value, "request_id")
    return request


def _utf8(value: memoryview, field: str) -> str:
    try:
        return str(value, "utf-8")
    except UnicodeDecodeError:
        raise InvalidArgumentError(f"malformed message: {field} is not valid UTF-8") from None
