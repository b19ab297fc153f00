"""The proto3 wire format, read and written directly: varints, tags and fields.

The zero-copy codecs (:mod:`pull_push_codec`, :mod:`step_codec`) build on these.
Reading rejects exactly what protobuf's own parser (upb) rejects, so a codec
accepts a message if and only if the generated classes would.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from ember.ps_server.errors import InvalidArgumentError

VARINT, FIXED64, LEN, _START_GROUP, _END_GROUP, FIXED32 = 0, 1, 2, 3, 4, 5
_MAX_FIELD_NUMBER = (1 << 29) - 1
_MAX_GROUP_DEPTH = 100  # protobuf's default nesting limit
_VARINT_BYTES = 10
_TAG_AND_LENGTH_BYTES = 5  # protobuf reads tags and lengths as 32-bit varints


def varint(value: int) -> bytes:
    """The varint encoding of a non-negative ``value``."""
    if 0 <= value < 128:
        return _ONE_BYTE[value]
    if value < 0:
        raise ValueError(f"a varint encodes a non-negative number, got {value}")
    if value < 1 << 14:  # most lengths: two bytes without the loop
        return bytes((value & 0x7F | 0x80, value >> 7))
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


_ONE_BYTE = [bytes([value]) for value in range(128)]


def _malformed(what: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"malformed message: {what}")


def read_varint(data: memoryview, pos: int, max_bytes: int = _VARINT_BYTES) -> tuple[int, int]:
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
    key, pos = read_varint(data, pos, _TAG_AND_LENGTH_BYTES)
    number, wire_type = key >> 3, key & 7
    if not 0 < number <= _MAX_FIELD_NUMBER:
        raise _malformed(f"field number {number}")
    if wire_type == VARINT:
        value, pos = read_varint(data, pos)
    elif wire_type == LEN:
        length, pos = read_varint(data, pos, _TAG_AND_LENGTH_BYTES)
        if length > len(data) - pos:
            raise _malformed("field runs past the end")
        value, pos = data[pos : pos + length], pos + length
    elif wire_type in (FIXED64, FIXED32):
        width = 8 if wire_type == FIXED64 else 4
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


def fields(data: memoryview, depth: int = 0) -> Iterator[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) of every field; LEN values are memoryviews. ``depth``:
    the messages ``data`` lies in (1 for a sub-message of a top-level one): protobuf counts
    them with the groups inside it towards one nesting limit.

    The common fields (a one-byte tag, then a one-byte varint or a LEN field whose length
    takes one or two bytes) are read inline; every other one, malformed ones included, by
    :func:`_field`. A step message holds a few fields per table, so this loop is most of
    its decoding time."""
    pos, end = 0, len(data)
    while pos < end:
        key = data[pos]
        if 8 <= key < 0x80 and pos + 1 < end:  # a one-byte tag of a valid field number
            wire_type, first = key & 7, data[pos + 1]
            if wire_type == LEN:
                if first < 0x80:
                    start = pos + 2
                elif pos + 2 < end and data[pos + 2] < 0x80:
                    first, start = (first & 0x7F) | data[pos + 2] << 7, pos + 3
                else:
                    start = 0
                if start and first <= end - start:
                    pos = start + first
                    yield key >> 3, LEN, data[start:pos]
                    continue
            elif wire_type == VARINT and first < 0x80:
                pos += 2
                yield key >> 3, VARINT, first
                continue
        number, wire_type, value, pos = _field(data, pos, depth)
        if wire_type == _END_GROUP:
            raise _malformed(f"group {number} closed but never opened")
        yield number, wire_type, value


def uint32(value: int) -> int:
    """A varint read as protobuf reads a ``uint32``: its low 32 bits."""
    return value & 0xFFFF_FFFF


def len_field(number: int, payload_length: int) -> bytes:
    return varint((number << 3) | LEN) + varint(payload_length)


def aligned_len_field(number: int, payload_length: int, offset: int, alignment: int = 4) -> bytes:
    """The tag and length of a LEN field written at ``offset``, its length's varint padded
    with continuation bytes (up to 5 bytes, which every protobuf parser and
    :func:`read_varint` read as the same number; the tag is never padded: the pure-Python
    protobuf matches tags by their bytes) so that the payload starts at a multiple of
    ``alignment`` (at most 4) where that room suffices: always below 16 KiB of payload, else
    not always (readers must not rely on it)."""
    if not 0 < alignment <= 4:
        raise ValueError(f"alignment must be in 1..4, got {alignment}")
    tag, length = varint((number << 3) | LEN), varint(payload_length)
    pad = -(offset + len(tag) + len(length)) % alignment
    return tag + overlong_varint(length, min(pad, _TAG_AND_LENGTH_BYTES - len(length)))


def aligned_varint_then_len(
    varint_number: int, value: bytes, len_number: int, payload_length: int, offset: int = 0
) -> bytes:
    """A VARINT field (``value``, a varint's bytes), then the tag and length of a LEN field,
    written at ``offset`` in a message so that the LEN payload starts 4-byte aligned: the
    length's varint is padded as :func:`aligned_len_field` pads it, and ``value`` with
    continuation bytes (up to a varint's 10) where that alone cannot align it (always
    possible below 256 MiB of payload; else the last try is returned, unaligned)."""
    tag = varint((varint_number << 3) | VARINT)
    for extra in range(min(4, _VARINT_BYTES - len(value) + 1)):
        lead = tag + overlong_varint(value, extra)
        header = lead + aligned_len_field(len_number, payload_length, offset + len(lead))
        if (offset + len(header)) % 4 == 0:
            break
    return header


def overlong_varint(encoded: bytes, extra: int) -> bytes:
    """The varint ``encoded`` written in ``extra`` more bytes (continuation bytes that every
    protobuf parser reads as the same number, up to a varint's 10 bytes)."""
    if not extra:
        return encoded
    return encoded[:-1] + bytes([encoded[-1] | 0x80]) + b"\x80" * (extra - 1) + b"\x00"


EMPTY = memoryview(b"")
Buffer = bytes | memoryview | np.ndarray


def bytes_view(buffer: Buffer) -> memoryview:
    """A C-contiguous ``buffer`` as a flat memoryview of bytes."""
    view = memoryview(buffer)
    return view.cast("B") if view.nbytes else EMPTY


def utf8(value: memoryview, field: str) -> str:
    """A string field's text; InvalidArgumentError if it is not UTF-8 (proto3 requires it)."""
    try:
        return str(value, "utf-8")
    except UnicodeDecodeError:
        raise InvalidArgumentError(f"malformed message: {field} is not valid UTF-8") from None


def int64(value: int) -> int:
    """A varint read as protobuf reads an ``int64``: two's complement of 64 bits."""
    return value - (1 << 64) if value >= 1 << 63 else value


def int64_varint(value: int) -> bytes:
    """An ``int64`` as its varint (a negative one takes ten bytes)."""
    return varint(value & 0xFFFF_FFFF_FFFF_FFFF)
