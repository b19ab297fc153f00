import sys

import pytest
from ember.ps_server.errors import InvalidArgumentError
from ember.ps_server.wire.messages import pb
from ember.ps_server.wire.proto_wire import (
    _field,
    aligned_len_field,
    fields,
    len_field,
    read_varint,
    varint,
)
from ember.ps_server.wire.pull_push_codec import (
    decode_pull_reply,
    decode_push_request,
    encode_pull_reply,
    encode_push_request,
    push_log_record,
)
from google.protobuf.internal.encoder import _VarintBytes
from google.protobuf.message import DecodeError
from hypothesis import example, given, settings
from hypothesis import strategies as st

text = st.text(max_size=40)
blobs = st.binary(max_size=3000)


@settings(max_examples=60, deadline=None)
@given(values=blobs, versions=blobs, dim=st.integers(0, 2**32 - 1), state=blobs)
def test_pull_reply_matches_generated_code_both_ways(values, versions, dim, state):
    encoded = encode_pull_reply(values, versions, dim, state)
    parsed = pb.PullResponse.FromString(encoded)
    assert (parsed.values, parsed.versions, parsed.dim, parsed.state) == (
        values, versions, dim, state,
    )  # fmt: skip
    view = decode_pull_reply(
        pb.PullResponse(values=values, versions=versions, dim=dim, state=state).SerializeToString()
    )
    assert (bytes(view.values), bytes(view.versions), view.dim, bytes(view.state)) == (
        values, versions, dim, state,
    )  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(table=text, ids=blobs, grads=blobs, request_id=text)
def test_push_request_matches_generated_code_both_ways(table, ids, grads, request_id):
    encoded = encode_push_request(table, ids, grads, request_id)
    parsed = pb.PushRequest.FromString(encoded)
    assert (parsed.table, parsed.ids, parsed.grads, parsed.request_id) == (
        table,
        ids,
        grads,
        request_id,
    )
    generated = pb.PushRequest(
        table=table, ids=ids, grads=grads, request_id=request_id
    ).SerializeToString()
    view = decode_push_request(generated)
    assert (view.table, bytes(view.ids), bytes(view.grads), view.request_id) == (
        table,
        ids,
        grads,
        request_id,
    )


@settings(max_examples=40, deadline=None)
@given(requests=st.lists(st.tuples(text, blobs, blobs, text), max_size=4))
def test_push_log_record_parses_as_the_generated_log_record(requests):
    joined = b"".join(bytes(part) for part in push_log_record(requests))
    expected = pb.LogRecord(
        push=pb.PushBatchRequest(
            requests=[
                pb.PushRequest(table=t, ids=i, grads=g, request_id=r) for t, i, g, r in requests
            ]
        )
    )
    assert pb.LogRecord.FromString(joined) == expected


def test_unknown_fields_are_skipped():
    message = pb.PushRequest(table="t", ids=b"12345678").SerializeToString()
    extra = bytes([(9 << 3) | 0, 0x96, 0x01, (10 << 3) | 5, 1, 2, 3, 4, (11 << 3) | 1]) + bytes(8)
    view = decode_push_request(extra + message)
    assert (view.table, bytes(view.ids)) == ("t", b"12345678")


@pytest.mark.parametrize(
    "data, message",
    [
        (bytes([(2 << 3) | 2, 10]) + b"abc", "runs past the end"),
        (bytes([(2 << 3) | 2, 0x80]), "varint"),
        (bytes([(2 << 3) | 3]), "group 2 is not closed"),
        (bytes([(2 << 3) | 3, (3 << 3) | 4]), "group 2 closed as group 3"),
        (bytes([(2 << 3) | 4]), "group 2 closed but never opened"),
        (bytes([(1 << 3) | 2, 2, 0xFF, 0xFE]), "not valid UTF-8"),
        (bytes([0, 1]), "field number 0"),
        (bytes([(7 << 3) | 1, 1, 2, 3, 4, 5, 6, 7]), "truncated fixed-width"),
        (bytes([(7 << 3) | 5, 1, 2, 3]), "truncated fixed-width"),
        (bytes([(7 << 3) | 0]) + b"\xff" * 10 + b"\x01", "longer than 10 bytes"),
        (bytes([(7 << 3) | 6]), "wire type 6"),
        (bytes([0x8A, 0x80, 0x80, 0x80, 0x80, 0x00, 1]) + b"t", "longer than 5 bytes"),  # tag
        (bytes([0x0A, 0x81, 0x80, 0x80, 0x80, 0x80, 0x00]) + b"t", "longer than 5 bytes"),  # len
    ],
)
def test_malformed_push_requests_raise_invalid_argument_as_protobuf_refuses_them(data, message):
    with pytest.raises(InvalidArgumentError, match=message):
        decode_push_request(data)
    with pytest.raises(DecodeError):
        pb.PushRequest.FromString(data)


def test_well_formed_unknown_groups_are_skipped_as_protobuf_skips_them():
    message = pb.PushRequest(table="t", request_id="r").SerializeToString()
    group = bytes([(9 << 3) | 3, (1 << 3) | 0, 5, (10 << 3) | 3, (10 << 3) | 4, (9 << 3) | 4])
    assert pb.PushRequest.FromString(group + message).table == "t"
    view = decode_push_request(group + message)
    assert (view.table, view.request_id) == ("t", "r")


def test_dim_reads_as_protobuf_reads_a_uint32():
    too_wide = bytes([3 << 3]) + b"\xff" * 9 + b"\x01"  # 2^64 - 1 as a varint
    assert pb.PullResponse.FromString(too_wide).dim == decode_pull_reply(too_wide).dim == 2**32 - 1


@settings(max_examples=200, deadline=None)
@given(
    offset=st.integers(0, 64),
    length=st.one_of(st.integers(0, 300), st.integers(0, 2**32 - 1)),
    number=st.integers(1, 2**20),
)
def test_aligned_len_fields_pad_only_the_length_and_read_as_the_same_field(offset, length, number):
    header = aligned_len_field(number, length, offset)
    tag = len_field(number, 0)[:-1]
    assert header.startswith(tag)  # the tag's bytes as written by every encoder
    size, end = read_varint(memoryview(header), len(tag), 5)
    assert (size, end) == (length, len(header))
    if length < 1 << 14:  # room for any padding: always aligned
        assert (offset + len(header)) % 4 == 0


@pytest.mark.parametrize("length", [200, 20_000, 3_000_000])
@pytest.mark.parametrize("offset", range(4))
def test_generated_code_reads_aligned_len_fields(offset, length):
    payload = bytes(range(256)) * (length // 256) + bytes(length % 256)
    message = aligned_len_field(1, len(payload), offset) + payload  # LookupResponse.values
    assert list(pb.LookupResponse.FromString(message).values) == [payload]


def test_varints_refuse_negative_numbers():
    with pytest.raises(ValueError, match="non-negative"):
        varint(-1)


@pytest.mark.parametrize(
    "value", [0, 1, 127, 128, 300, 16383, 16384, 2**21 - 1, 2**21, 2**35 + 7, 2**63, 2**64 - 1]
)
def test_varints_are_protobufs_own_bytes_and_read_back(value):
    assert varint(value) == _VarintBytes(value)
    assert read_varint(memoryview(varint(value)), 0) == (value, len(varint(value)))


def test_a_big_endian_host_is_refused_by_shards_and_clients(monkeypatch):
    """The codecs write host-order values into a little-endian wire: both ends refuse to
    start where the two differ, rather than send rows no peer can read."""
    from ember.ps_server.client.ps_client import PSClient
    from ember.ps_server.shard.server import ParameterServer

    monkeypatch.setattr(sys, "byteorder", "big")
    with pytest.raises(RuntimeError, match="big-endian, which Ember does not support"):
        ParameterServer(0, 1)
    with pytest.raises(RuntimeError, match="big-endian"):
        PSClient(["localhost:1"])


def _fields_by_the_general_reader(data: memoryview) -> list:
    """What :func:`fields` yields, read field by field by ``_field`` alone (no fast path)."""
    out, pos = [], 0
    while pos < len(data):
        number, wire_type, value, pos = _field(data, pos, depth=0)
        if wire_type == 4:  # an end-group with no start
            raise InvalidArgumentError("end group")
        out.append((number, wire_type, bytes(value) if wire_type == 2 else value))
    return out


def _len_field_then(length: int, present: int) -> bytes:
    """A LEN field of ``length`` with ``present`` bytes of payload after its length."""
    return b"\x12" + varint(length) + bytes(present)


@settings(max_examples=3000, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from([b"\x08", b"\x0a", b"\x12", b"\x7a", b"\x80", b"\x81\x01", b"\x00"]),
            st.binary(max_size=3),
            st.integers(0, 300).map(lambda n: _len_field_then(n, min(n, 40))),
            # lengths of two and three bytes, their payloads whole, short, or with room over
            st.tuples(st.integers(0, 40_000), st.sampled_from([0.5, 1, 2])).map(
                lambda n: _len_field_then(n[0], int(n[0] * n[1]))
            ),
        ),
        max_size=12,
    ).map(b"".join)
)
@example(b"\x12\x80\x01" + bytes(256))  # a two-byte length read as 128, with room for more
@example(b"\x12\x80\x80\x01" + bytes(16384))  # a three-byte length
def test_fields_read_inline_exactly_what_the_general_reader_reads(data):
    # The inline path covers one-byte tags with short varints and LEN lengths of one or two
    # bytes; a misread (a length past the end, a length's bytes decoded wrong, a zero tag)
    # must show here.
    try:
        expected = _fields_by_the_general_reader(memoryview(data))
    except InvalidArgumentError:
        with pytest.raises(InvalidArgumentError):
            list(fields(memoryview(data)))
        return
    got = [(n, w, bytes(v) if w == 2 else v) for n, w, v in fields(memoryview(data))]
    assert got == expected
