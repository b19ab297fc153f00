"""The UCX frame header: what it carries, and every way a header or payload is refused."""

from __future__ import annotations

import struct

import pytest
from ember.ps_server.errors import InvalidArgumentError, Status, status_for
from ember.ps_server.wire.frames import (
    END_MARK,
    HEADER_BYTES,
    MIXED_DTYPES,
    NO_CLOCK,
    FrameError,
    FrameHeader,
    FrameTooLargeError,
    Op,
    RowDtype,
    check_header_matches,
    frame_dtype,
    payload_body,
)

LIMIT = 1 << 20


def test_a_header_round_trips_every_field() -> None:
    header = FrameHeader(
        Op.UPDATE, request_id=2**63 + 5, payload_bytes=1000, tables=26, clock=7,
        dtype=RowDtype.BFLOAT16, status=Status.DEADLINE_EXCEEDED,
    )  # fmt: skip
    data = header.encode()
    assert len(data) == HEADER_BYTES
    assert FrameHeader.decode(data, LIMIT) == header


def _with(field: int, value: int) -> bytes:
    """A valid header's bytes with field number ``field`` (0-based, as packed) replaced."""
    fields = list(struct.unpack("<4sBBBBIQqQ4s", FrameHeader(Op.LOOKUP, 1, 100).encode()))
    fields[field] = value
    return struct.pack("<4sBBBBIQqQ4s", *fields)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_with(0, b"HTTP"), "magic"),
        (_with(1, 2), "version 2"),
        (_with(2, 0), "unknown frame op 0"),
        (_with(2, 9), "unknown frame op 9"),
        (_with(3, 100), "unknown status 100"),
        (_with(3, 0x80 | 100), "unknown status 100"),
        (_with(3, 0x80), "status OK carries the restart mark"),  # as a reply
        (_with(3, 0x80 | 13), "status INTERNAL carries the restart mark"),
        (_with(4, 7), "unknown row dtype 7"),
        (_with(6, LIMIT + 1), "outside"),
        (_with(6, 2**64 - 1), "outside"),
        (_with(6, 0), "outside"),  # not even room for the end mark
        (_with(7, -2), "clock must be >= 0"),
        (_with(9, bytes(4)), "cut short"),  # a short header leaves its zeroed tail
        (FrameHeader(Op.LOOKUP, 1, 100).encode()[:-1], "header is"),
    ],
)
def test_a_header_that_lies_is_refused_before_any_payload_is_allocated(
    data: bytes, message: str
) -> None:
    with pytest.raises(FrameError, match=message):
        FrameHeader.decode(data, LIMIT)


def test_the_restart_mark_asks_for_it_in_a_request_and_says_it_in_an_unavailable_reply():
    for marked in (False, True):
        request = FrameHeader(Op.LOOKUP, 3, 100, restart_mark=marked)
        assert FrameHeader.decode(request.encode(), LIMIT, request=True).restart_mark is marked
        reply = FrameHeader(Op.UPDATE, 3, 100, status=Status.UNAVAILABLE, restart_mark=marked)
        assert FrameHeader.decode(reply.encode(), LIMIT).restart_mark is marked
    with pytest.raises(ValueError, match="INTERNAL frame cannot carry the restart mark"):
        FrameHeader(Op.UPDATE, 3, 100, status=Status.INTERNAL, restart_mark=True)
    refused = FrameHeader(Op.LOOKUP, 1, 100, status=Status.UNAVAILABLE, restart_mark=True)
    with pytest.raises(FrameError, match="request carries status UNAVAILABLE"):
        FrameHeader.decode(refused.encode(), LIMIT, request=True)


def test_a_request_must_carry_status_ok() -> None:
    asked = FrameHeader(Op.LOOKUP, 1, 100, status=Status.UNAVAILABLE).encode()
    assert FrameHeader.decode(asked, LIMIT).status == Status.UNAVAILABLE  # a reply may
    with pytest.raises(FrameError, match="request carries status UNAVAILABLE"):
        FrameHeader.decode(asked, LIMIT, request=True)


def test_frame_errors_are_invalid_argument_but_a_payload_over_the_limit_is_too_large() -> None:
    assert status_for(FrameError("x")) == Status.INVALID_ARGUMENT
    with pytest.raises(FrameTooLargeError) as refused:
        FrameHeader.decode(_with(6, LIMIT + 1), LIMIT)
    assert status_for(refused.value) == Status.RESOURCE_EXHAUSTED
    assert isinstance(refused.value, FrameError)  # the stream is not trusted after it
    with pytest.raises(FrameError) as short:
        FrameHeader.decode(_with(6, 0), LIMIT)
    assert not isinstance(short.value, FrameTooLargeError)


def test_a_payload_cut_short_leaves_the_zeroed_tail_and_is_refused() -> None:
    sent = b"message" + END_MARK
    received = bytearray(len(sent) + 8)  # the header claimed 8 more bytes than came
    received[: len(sent)] = sent
    with pytest.raises(FrameError, match="shorter"):
        payload_body(memoryview(bytes(received)))
    assert bytes(payload_body(memoryview(sent))) == b"message"


def test_a_header_must_agree_with_its_message() -> None:
    header = FrameHeader(Op.LOOKUP, 1, 100, tables=2, clock=NO_CLOCK)
    check_header_matches(header, 2, None, [0, 0])
    with pytest.raises(InvalidArgumentError, match="2 tables, its message 3"):
        check_header_matches(header, 3, None, [0, 0])
    with pytest.raises(InvalidArgumentError, match="clock -1, its message 4"):
        check_header_matches(header, 2, 4, [0, 0])
    with pytest.raises(InvalidArgumentError, match="dtype float32, its message bfloat16"):
        check_header_matches(header, 2, None, [RowDtype.BFLOAT16] * 2)
    with pytest.raises(InvalidArgumentError, match="dtype float32, its message mixed"):
        check_header_matches(header, 2, None, [RowDtype.FLOAT32, RowDtype.FLOAT16])
    with pytest.raises(InvalidArgumentError, match="its message 9 [(]unknown[)]"):
        check_header_matches(header, 2, None, [9, 9])
    mixed = FrameHeader(Op.LOOKUP, 1, 100, tables=2, dtype=MIXED_DTYPES)
    check_header_matches(mixed, 2, None, [RowDtype.FLOAT32, RowDtype.FLOAT16])


def test_a_frame_dtype_is_the_one_its_entries_share() -> None:
    assert frame_dtype([]) == RowDtype.FLOAT32
    assert frame_dtype([RowDtype.BFLOAT16] * 3) == RowDtype.BFLOAT16
    assert frame_dtype([RowDtype.FLOAT16, RowDtype.BFLOAT16]) == MIXED_DTYPES
    assert (
        FrameHeader.decode(FrameHeader(Op.LOOKUP, 1, 8, dtype=MIXED_DTYPES).encode(), 64).dtype
        == MIXED_DTYPES
    )
