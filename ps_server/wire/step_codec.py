"""Zero-copy codecs of the step data plane: Lookup and Update, both ways.

A step's lookup and update carry every table of one shard in one message, so
they are the largest messages of training. As :mod:`pull_push_codec` does for Pull
and Push, these codecs read and write the proto3 wire format directly:
decoding returns memoryviews into the received bytes, encoding joins the
payloads into the message in one copy. They accept exactly what the
generated classes accept (a repeated ``clock`` message is merged field by
field, as protobuf merges it); the tests compare both ways.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from ember.ps_server.wire.new_bytes import fill_new_bytes
from ember.ps_server.wire.proto_wire import (
    EMPTY,
    LEN,
    VARINT,
    Buffer,
    aligned_len_field,
    aligned_varint_then_len,
    bytes_view,
    fields,
    int64,
    int64_varint,
    len_field,
    uint32,
    utf8,
    varint,
)
from ember.ps_server.wire.row_dtype import RowDtype
from ember.ps_server.wire.step_messages import (
    GradsEntry,
    IdsEntry,
    LookupRequestView,
    LookupResponseView,
    StepClockView,
    TableGradsView,
    TableIdsView,
    UpdateRequestView,
    UpdateResponseView,
)

# ---- encoding -----------------------------------------------------------------


def _message(number: int, parts: list[bytes | memoryview]) -> list[bytes | memoryview]:
    return [len_field(number, sum(len(part) for part in parts)), *parts]


@functools.lru_cache(maxsize=4096)  # table names and job names repeat every step
def _string(number: int, text: str) -> tuple[bytes, ...]:
    data = text.encode()
    return (len_field(number, len(data)), data) if data else ()


def _payload(number: int, buffer: Buffer) -> list[bytes | memoryview]:
    view = bytes_view(buffer)
    return [len_field(number, len(view)), view] if len(view) else []


def _scalar(number: int, value: int, encode=varint) -> list[bytes]:
    return [varint(number << 3), encode(value)] if value else []


def _clock(number: int, clock: StepClockView | None) -> list[bytes | memoryview]:
    if clock is None:
        return []
    return _message(
        number,
        [
            *_string(1, clock.job),
            *_scalar(2, clock.world),
            *_scalar(3, clock.rank),
            *_scalar(4, clock.clock, int64_varint),
            *_scalar(5, clock.mode),
            *_scalar(6, clock.wait_ms),
        ],
    )


def _table_entry(number: int, table: str, payloads: tuple[Buffer, ...], dtype: int) -> list:
    """A TableIds (``payloads``: ids) or TableGrads (ids, grads) entry as field ``number``:
    the table's name (field 1), each non-empty payload (fields 2, 3, ...), then the dtype.
    Built with few calls: a step has one per table and shard, and their bookkeeping is
    most of the encoder's time."""
    parts: list[bytes | memoryview] = [*_string(1, table)]
    for field, payload in enumerate(payloads, 2):
        view = bytes_view(payload)
        if len(view):
            parts += (len_field(field, len(view)), view)
    if dtype:
        parts += (_DTYPE_TAGS[len(payloads)], int64_varint(dtype))
    parts[:0] = (len_field(number, sum(map(len, parts))),)
    return parts


_DTYPE_TAGS = {1: varint(3 << 3), 2: varint(4 << 3)}  # TableIds.dtype, TableGrads.dtype


def _table_ids(number: int, entry: tuple) -> list[bytes | memoryview]:
    table, ids, dtype = IdsEntry(*entry)
    return _table_entry(number, table, (ids,), dtype)


def _table_grads(number: int, entry: tuple) -> list[bytes | memoryview]:
    table, ids, grads, dtype = GradsEntry(*entry)
    return _table_entry(number, table, (ids, grads), dtype)


def encode_lookup_request(
    tables: Sequence[tuple],
    clock: StepClockView | None,
    trailer: bytes = b"",
    joined_rows: bool = False,
) -> bytes:
    """Serialise a LookupRequest of :class:`IdsEntry` fields ``(table, ids[, dtype])``, then
    ``trailer`` (a transport's framing, in the same copy); ``joined_rows``: ask for the rows
    in one payload."""
    parts = [part for entry in tables for part in _table_ids(1, entry)]
    return b"".join([*parts, *_clock(2, clock), *_scalar(3, int(joined_rows)), trailer])


def encode_update_request(
    tables: Sequence[tuple],
    clock: StepClockView | None,
    refresh: Sequence[tuple] = (),
    replica: bool = False,
    trailer: bytes = b"",
    read: Sequence[tuple] = (),
    read_state: Sequence[tuple] = (),
) -> bytes:
    """Serialise an UpdateRequest of :class:`GradsEntry` fields ``(table, ids, grads[, dtype])``
    and refresh, read and read_state :class:`IdsEntry` fields, then ``trailer``."""
    parts = [part for entry in tables for part in _table_grads(1, entry)]
    refreshes = [part for entry in refresh for part in _table_ids(3, entry)]
    reads = [part for entry in read for part in _table_ids(5, entry)]
    states = [part for entry in read_state for part in _table_ids(6, entry)]
    return b"".join(
        [*parts, *_clock(2, clock), *refreshes, *_scalar(4, int(replica)), *reads, *states,
         trailer]
    )  # fmt: skip


def encode_lookup_response(
    row_bytes: Sequence[int],
    fill_rows: Callable[[int, memoryview], None],
    watermark: int,
    trailer: bytes = b"",
    joined_rows: bool = False,
) -> bytes:
    """Serialise a LookupResponse, then ``trailer``, in one pass: entry ``i``'s rows are
    ``row_bytes[i]`` bytes, written in place by ``fill_rows(i, view)`` (which must write all
    of them and keep no reference to the view; what it raises goes on, and nothing is
    returned), each in its own ``values`` entry or (``joined_rows``: the watermark first)
    back to back in ``rows``. Payloads start 4-byte aligned from the message's start where
    :func:`aligned_len_field` (or :func:`aligned_varint_then_len`) has room (fillers must
    not rely on it)."""
    tail = b"".join([*_scalar(2, watermark, int64_varint), trailer])
    if joined_rows:  # one payload (omitted when empty, as proto3 omits an empty bytes field)
        payload = sum(row_bytes)
        header = b""
        if payload:  # the watermark first, then the rows
            header = aligned_varint_then_len(2, int64_varint(watermark), 3, payload)
            tail = trailer
        headers = [header, *[b""] * (len(row_bytes) - 1)] if row_bytes else []
        offset = len(header) + payload
    else:
        headers, offset = [], 0
        for size in row_bytes:
            headers.append(aligned_len_field(1, size, offset))
            offset += len(headers[-1]) + size
    total = offset + len(tail)

    def fill(view: memoryview) -> None:
        pos = 0
        for index, (header, size) in enumerate(zip(headers, row_bytes)):
            view[pos : pos + len(header)] = header
            pos += len(header)
            fill_rows(index, view[pos : pos + size])
            pos += size
        view[pos:] = tail

    return fill_new_bytes(total, fill)


def encode_update_response(
    duplicate: bool,
    refreshed: Sequence[tuple[Buffer, Buffer, int]],
    watermark: int,
    flush: str = "",
    trailer: bytes = b"",
    row_bytes: int = 0,
    fill_rows: Callable[[memoryview], None] | None = None,
    state_bytes: int = 0,
    fill_state: Callable[[memoryview], None] | None = None,
) -> bytes:
    """Serialise an UpdateResponse (``refreshed``: ``(positions, values, dtype)``), then
    ``trailer``, in one pass: the read entries' rows (``row_bytes``, omitted when 0) come
    first, after the watermark, and the ``state`` (``state_bytes``, omitted when 0) last,
    after ``duplicate``, each 4-byte aligned as :func:`aligned_varint_then_len` aligns
    them and written in place by ``fill_rows(view)`` or ``fill_state(view)`` as
    :func:`encode_lookup_response`'s filler writes them."""
    if (row_bytes and fill_rows is None) or (state_bytes and fill_state is None):
        raise ValueError("an update's answer with rows or state needs their filler")
    parts = []
    for positions, values, dtype in refreshed:
        parts += _message(
            2, [*_payload(1, positions), *_payload(2, values), *_scalar(3, dtype, int64_varint)]
        )
    middle = b"".join([*parts, *_string(4, flush)])
    if row_bytes:
        head = aligned_varint_then_len(3, int64_varint(watermark), 5, row_bytes)
    else:
        head = b"".join(_scalar(3, watermark, int64_varint))
    rows_end = len(head) + row_bytes
    if state_bytes:  # an explicit duplicate (even false) pads the state into alignment
        middle += aligned_varint_then_len(
            1, varint(int(duplicate)), 6, state_bytes, rows_end + len(middle)
        )
    else:
        middle += b"".join(_scalar(1, int(duplicate)))
    state_at = rows_end + len(middle)
    end = state_at + state_bytes

    def fill(view: memoryview) -> None:
        view[: len(head)] = head
        if row_bytes:
            fill_rows(view[len(head) : rows_end])
        view[rows_end:state_at] = middle
        if state_bytes:
            fill_state(view[state_at:end])
        view[end:] = trailer

    return fill_new_bytes(end + len(trailer), fill)


# ---- decoding -----------------------------------------------------------------


def _decode_clock(data: memoryview, clock: StepClockView) -> StepClockView:
    """``clock`` with the fields of ``data`` merged in (protobuf merges a repeated message)."""
    for number, wire_type, value in fields(data, depth=1):
        if number == 1 and wire_type == LEN:
            clock.job = utf8(value, "clock.job")
        elif wire_type != VARINT:
            continue
        elif number == 2:
            clock.world = uint32(value)
        elif number == 3:
            clock.rank = uint32(value)
        elif number == 4:
            clock.clock = int64(value)
        elif number == 5:
            clock.mode = _int32(value)
        elif number == 6:
            clock.wait_ms = uint32(value)
    return clock


def _int32(value: int) -> int:
    value &= 0xFFFF_FFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _decode_table_ids(data: memoryview) -> TableIdsView:
    entry = TableIdsView(table="", ids=EMPTY)
    for number, wire_type, value in fields(data, depth=1):
        if wire_type == LEN and number == 1:
            entry.table = utf8(value, "table")
        elif wire_type == LEN and number == 2:
            entry.ids = value
        elif wire_type == VARINT and number == 3:
            entry.dtype = _int32(value)
    return entry


def _decode_table_grads(data: memoryview) -> TableGradsView:
    entry = TableGradsView(table="", ids=EMPTY, grads=EMPTY)
    for number, wire_type, value in fields(data, depth=1):
        if wire_type == VARINT and number == 4:
            entry.dtype = _int32(value)
        if wire_type != LEN:
            continue
        if number == 1:
            entry.table = utf8(value, "table")
        elif number == 2:
            entry.ids = value
        elif number == 3:
            entry.grads = value
    return entry


def decode_lookup_request(data: bytes) -> LookupRequestView:
    """Parse a serialised LookupRequest without copying its payloads."""
    request = LookupRequestView(tables=[], clock=None)
    for number, wire_type, value in fields(memoryview(data)):
        if number == 3 and wire_type == VARINT:
            request.joined_rows = bool(value)
        if wire_type != LEN:
            continue
        if number == 1:
            request.tables.append(_decode_table_ids(value))
        elif number == 2:
            request.clock = _decode_clock(value, request.clock or StepClockView())
    return request


def decode_update_request(data: bytes) -> UpdateRequestView:
    """Parse a serialised UpdateRequest without copying its payloads."""
    request = UpdateRequestView(tables=[], clock=None, refresh=[])
    for number, wire_type, value in fields(memoryview(data)):
        if number == 4 and wire_type == VARINT:
            request.replica = bool(value)
        if wire_type != LEN:
            continue
        if number == 1:
            request.tables.append(_decode_table_grads(value))
        elif number == 2:
            request.clock = _decode_clock(value, request.clock or StepClockView())
        elif number == 3:
            request.refresh.append(_decode_table_ids(value))
        elif number == 5:
            request.read.append(_decode_table_ids(value))
        elif number == 6:
            request.read_state.append(_decode_table_ids(value))
    return request


def decode_lookup_response(data: bytes) -> LookupResponseView:
    """Parse a serialised LookupResponse without copying its rows."""
    response = LookupResponseView(values=[], watermark=0, size=len(data))
    for number, wire_type, value in fields(memoryview(data)):
        if number == 1 and wire_type == LEN:
            response.values.append(value)
        elif number == 2 and wire_type == VARINT:
            response.watermark = int64(value)
        elif number == 3 and wire_type == LEN:
            response.rows = value
    return response


def decode_update_response(data: bytes) -> UpdateResponseView:
    """Parse a serialised UpdateResponse without copying its rows."""
    response = UpdateResponseView(duplicate=False, refreshed=[], watermark=0, size=len(data))
    for number, wire_type, value in fields(memoryview(data)):
        if number == 1 and wire_type == VARINT:
            response.duplicate = bool(value)
        elif number == 2 and wire_type == LEN:
            positions, values, dtype = EMPTY, EMPTY, RowDtype.FLOAT32
            for inner, inner_type, payload in fields(value, depth=1):
                if inner_type == LEN and inner == 1:
                    positions = payload
                elif inner_type == LEN and inner == 2:
                    values = payload
                elif inner_type == VARINT and inner == 3:
                    dtype = _int32(payload)
            response.refreshed.append((positions, values, dtype))
        elif number == 3 and wire_type == VARINT:
            response.watermark = int64(value)
        elif number == 4 and wire_type == LEN:
            response.flush = utf8(value, "flush")
        elif number == 5 and wire_type == LEN:
            response.rows = value
        elif number == 6 and wire_type == LEN:
            response.state = value
    return response
