import os
import subprocess
import sys

"""The step codecs match the generated classes both ways, and reject what protobuf rejects."""

import random

import numpy as np
import pytest
from ember.ps_server.errors import InvalidArgumentError
from ember.ps_server.wire.messages import pb
from ember.ps_server.wire.proto_wire import len_field
from ember.ps_server.wire.step_codec import (
    StepClockView,
    decode_lookup_request,
    decode_lookup_response,
    decode_update_request,
    decode_update_response,
    encode_lookup_request,
    encode_lookup_response,
    encode_update_request,
    encode_update_response,
)
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.mutations import mutated

names = st.text(max_size=12)
blobs = st.binary(max_size=200)
clocks = st.none() | st.builds(
    StepClockView,
    job=names,
    world=st.integers(0, 2**32 - 1),
    rank=st.integers(0, 2**32 - 1),
    clock=st.integers(-(2**63), 2**63 - 1),
    mode=st.sampled_from([0, 1, 2]),
    wait_ms=st.integers(0, 2**32 - 1),
)


def _lookup_response(values, watermark, joined_rows=False):
    """``encode_lookup_response`` of given rows, copied into place."""
    views = [memoryview(v).cast("B") if memoryview(v).nbytes else b"" for v in values]

    def fill(index, view):
        view[:] = views[index]

    return encode_lookup_response([len(v) for v in views], fill, watermark, b"", joined_rows)


def test_large_lookup_responses_are_written_in_place_and_match_the_generated_code():
    # Over fill_new_bytes' threshold the rows are written into the new bytes object itself.
    values = [np.arange(3000, dtype="<f4").tobytes(), b"", bytes(range(256)) * 40]
    encoded = _lookup_response(values, 12)
    assert isinstance(encoded, bytes) and len(encoded) > 4096
    parsed = pb.LookupResponse.FromString(encoded)
    assert list(parsed.values) == values and parsed.watermark == 12


def _pb_clock(clock):
    if clock is None:
        return None
    return pb.StepClock(
        job=clock.job, world=clock.world, rank=clock.rank, clock=clock.clock, mode=clock.mode,
        wait_ms=clock.wait_ms,
    )  # fmt: skip


def _view_clock(message, present):
    if not present:
        return None
    c = message.clock
    return StepClockView(c.job, c.world, c.rank, c.clock, c.mode, c.wait_ms)


dtypes = st.sampled_from([0, 1, 2, -1, 300])  # RowDtype numbers, and ones it does not define


@settings(max_examples=80, deadline=None)
@given(
    tables=st.lists(st.tuples(names, blobs, dtypes), max_size=4), clock=clocks,
    joined=st.booleans(),
)  # fmt: skip
def test_lookup_requests_match_the_generated_code_both_ways(tables, clock, joined):
    encoded = encode_lookup_request(tables, clock, joined_rows=joined)
    parsed = pb.LookupRequest.FromString(encoded)
    assert [(t.table, t.ids, t.dtype) for t in parsed.tables] == tables
    assert _view_clock(parsed, parsed.HasField("clock")) == clock
    assert parsed.joined_rows == joined
    generated = pb.LookupRequest(
        tables=[pb.TableIds(table=t, ids=i, dtype=d) for t, i, d in tables],
        clock=_pb_clock(clock), joined_rows=joined,
    ).SerializeToString()  # fmt: skip
    view = decode_lookup_request(generated)
    assert [(t.table, bytes(t.ids), t.dtype) for t in view.tables] == tables
    assert view.clock == clock and view.joined_rows == joined


def test_entries_without_a_dtype_travel_as_float32_and_unknown_dtypes_decode_unchecked():
    assert encode_lookup_request([("a", b"12345678")], None) == encode_lookup_request(
        [("a", b"12345678", 0)], None
    )
    generated = pb.UpdateRequest(
        tables=[pb.TableGrads(table="a", dtype=-3)], refresh=[pb.TableIds(table="a", dtype=300)]
    ).SerializeToString()
    view = decode_update_request(generated)
    assert (view.tables[0].dtype, view.refresh[0].dtype) == (-3, 300)


@settings(max_examples=80, deadline=None)
@given(
    tables=st.lists(st.tuples(names, blobs, blobs, dtypes), max_size=4),
    clock=clocks,
    refresh=st.lists(st.tuples(names, blobs, dtypes), max_size=3),
    replica=st.booleans(),
    read=st.lists(st.tuples(names, blobs, dtypes), max_size=3),
    read_state=st.lists(st.tuples(names, blobs, dtypes), max_size=3),
)
def test_update_requests_match_the_generated_code_both_ways(
    tables, clock, refresh, replica, read, read_state
):
    encoded = encode_update_request(
        tables, clock, refresh, replica, read=read, read_state=read_state
    )
    parsed = pb.UpdateRequest.FromString(encoded)
    assert [(t.table, t.ids, t.grads, t.dtype) for t in parsed.tables] == tables
    assert [(t.table, t.ids, t.dtype) for t in parsed.refresh] == refresh
    assert [(t.table, t.ids, t.dtype) for t in parsed.read] == read
    assert [(t.table, t.ids, t.dtype) for t in parsed.read_state] == read_state
    assert _view_clock(parsed, parsed.HasField("clock")) == clock and parsed.replica == replica
    generated = pb.UpdateRequest(
        tables=[pb.TableGrads(table=t, ids=i, grads=g, dtype=d) for t, i, g, d in tables],
        clock=_pb_clock(clock),
        refresh=[pb.TableIds(table=t, ids=i, dtype=d) for t, i, d in refresh],
        replica=replica,
        read=[pb.TableIds(table=t, ids=i, dtype=d) for t, i, d in read],
        read_state=[pb.TableIds(table=t, ids=i, dtype=d) for t, i, d in read_state],
    ).SerializeToString()
    view = decode_update_request(generated)
    assert [(t.table, bytes(t.ids), bytes(t.grads), t.dtype) for t in view.tables] == tables
    assert [(t.table, bytes(t.ids), t.dtype) for t in view.refresh] == refresh
    assert [(t.table, bytes(t.ids), t.dtype) for t in view.read] == read
    assert [(t.table, bytes(t.ids), t.dtype) for t in view.read_state] == read_state
    assert view.clock == clock
    assert view.replica == replica


@settings(max_examples=80, deadline=None)
@given(
    values=st.lists(blobs, max_size=4),
    watermark=st.integers(-(2**63), 2**63 - 1),
    duplicate=st.booleans(),
    refreshed=st.lists(st.tuples(blobs, blobs, dtypes), max_size=3),
    flush=names,
    rows=blobs | st.binary(min_size=5000, max_size=5000),  # small, and over the in-place size
    state=blobs,
)
def test_responses_match_the_generated_code_both_ways(
    values, watermark, duplicate, refreshed, flush, rows, state
):
    parsed = pb.LookupResponse.FromString(_lookup_response(values, watermark))
    assert list(parsed.values) == values and parsed.watermark == watermark and not parsed.rows
    view = decode_lookup_response(
        pb.LookupResponse(values=values, watermark=watermark).SerializeToString()
    )
    assert [bytes(v) for v in view.values] == values and view.watermark == watermark
    assert view.rows == b""
    joined = pb.LookupResponse.FromString(_lookup_response(values, watermark, joined_rows=True))
    assert joined.rows == b"".join(values) and not joined.values
    assert joined.watermark == watermark
    view = decode_lookup_response(
        pb.LookupResponse(rows=b"".join(values), watermark=watermark).SerializeToString()
    )
    assert bytes(view.rows) == b"".join(values) and not view.values

    def fill(view):
        view[:] = rows

    def fill_state(view):
        view[:] = state

    encoded = encode_update_response(
        duplicate, refreshed, watermark, flush, b"", len(rows), fill, len(state), fill_state
    )
    parsed = pb.UpdateResponse.FromString(encoded)
    assert parsed.duplicate == duplicate and parsed.watermark == watermark
    assert parsed.flush == flush and parsed.rows == rows and parsed.state == state
    assert [(r.positions, r.values, r.dtype) for r in parsed.refreshed] == refreshed
    if rows:  # first the watermark, then the rows, 4-byte aligned
        assert _rows_start(encoded, rows) % 4 == 0
    if state:  # last, 4-byte aligned
        assert _payload_start(encoded, decode_update_response(encoded).state, state) % 4 == 0
    view = decode_update_response(
        pb.UpdateResponse(
            duplicate=duplicate,
            refreshed=[pb.RefreshedRows(positions=p, values=v, dtype=d) for p, v, d in refreshed],
            watermark=watermark,
            flush=flush,
            rows=rows,
            state=state,
        ).SerializeToString()
    )
    assert view.duplicate == duplicate and view.watermark == watermark and view.flush == flush
    assert bytes(view.rows) == rows and bytes(view.state) == state
    assert [(bytes(p), bytes(v), d) for p, v, d in view.refreshed] == refreshed


def _rows_start(encoded: bytes, rows: bytes) -> int:
    """Where an encoded UpdateResponse's ``rows`` payload starts (it must hold ``rows``)."""
    return _payload_start(encoded, decode_update_response(encoded).rows, rows)


def _payload_start(encoded: bytes, view: memoryview, payload: bytes) -> int:
    """Where ``view`` (a decoded payload of ``encoded``, which must hold ``payload``)
    starts in ``encoded``."""
    start = np.frombuffer(view, np.uint8).ctypes.data - np.frombuffer(encoded, np.uint8).ctypes.data
    assert encoded[start : start + len(payload)] == payload
    return start


@pytest.mark.parametrize("size", [4 << 10, 1 << 20, 3 << 20])  # length varints of 2, 3, 4 bytes
@pytest.mark.parametrize("watermark", [-1, 0, 7, 2**40])
def test_an_update_responses_rows_start_aligned_however_long(size, watermark):
    rows = bytes(size)

    def fill(view):
        view[:] = rows

    encoded = encode_update_response(False, [], watermark, "f", b"", size, fill)
    assert _rows_start(encoded, rows) % 4 == 0
    parsed = decode_update_response(encoded)
    assert parsed.watermark == watermark and parsed.flush == "f" and len(parsed.rows) == size


@pytest.mark.parametrize("state_size", [4 << 10, (1 << 20) + 8, (3 << 20) + 4])
@pytest.mark.parametrize("flush", ["", "f", "abc", "abcd"])  # 0, 3, 5, 6 bytes: each offset mod 4
@pytest.mark.parametrize("duplicate", [False, True])
@pytest.mark.parametrize("row_count", [0, 100])
def test_an_update_responses_state_starts_aligned_however_long(
    state_size, flush, duplicate, row_count
):
    rows, state = (
        bytes(range(12)) * row_count,
        bytes(range(256)) * (state_size // 256) + b"s" * (state_size % 256),
    )

    def fill(view):
        view[:] = rows

    def fill_state(view):
        view[:] = state

    encoded = encode_update_response(
        duplicate, [], 5, flush, b"", len(rows), fill, len(state), fill_state
    )
    assert _payload_start(encoded, decode_update_response(encoded).state, state) % 4 == 0
    parsed = pb.UpdateResponse.FromString(encoded)
    assert parsed.duplicate == duplicate and parsed.flush == flush and parsed.watermark == 5
    assert parsed.rows == rows and parsed.state == state


def test_a_repeated_clock_is_merged_field_by_field_as_protobuf_merges_it():
    first = pb.UpdateRequest(clock=pb.StepClock(job="j", world=2, clock=5)).SerializeToString()
    second = pb.UpdateRequest(clock=pb.StepClock(rank=1, clock=6)).SerializeToString()
    merged = pb.UpdateRequest.FromString(first + second).clock
    view = decode_update_request(first + second).clock
    assert (view.job, view.world, view.rank, view.clock) == (
        merged.job, merged.world, merged.rank, merged.clock,
    ) == ("j", 2, 1, 6)  # fmt: skip


def test_mutated_step_messages_are_accepted_exactly_when_protobuf_accepts_them():
    rng = random.Random(11)
    clock = StepClockView(job="job-1", world=2, rank=1, clock=7, mode=1, wait_ms=5000)
    ids = np.arange(4, dtype="<i8")
    grads = np.ones((4, 2), "<f4")
    cases = [
        (encode_lookup_request([("a", ids), ("b", ids[:2])], clock, joined_rows=True),
         decode_lookup_request,
         pb.LookupRequest),
        (encode_update_request([("a", ids, grads)], clock, [("a", ids)], replica=True),
         decode_update_request, pb.UpdateRequest),
        (_lookup_response([grads, grads], 3), decode_lookup_response, pb.LookupResponse),
        (_lookup_response([grads, ids], 3, joined_rows=True), decode_lookup_response,
         pb.LookupResponse),
        (encode_update_response(True, [(ids, grads, 1)], 3, "ckpt-1"), decode_update_response,
         pb.UpdateResponse),
    ]  # fmt: skip
    for valid, ours, message in cases:
        outcomes = set()
        for _ in range(1500):
            data = mutated(valid, rng)
            try:
                message.FromString(data)
                expected = True
            except DecodeError:
                expected = False
            try:
                ours(data)
                accepted = True
            except InvalidArgumentError:
                accepted = False
            assert accepted == expected, (message.__name__, data.hex())
            outcomes.add(accepted)
        assert outcomes == {True, False}


@pytest.mark.parametrize(
    "joined, watermark", [(False, 7), (True, 7), (True, -1), (True, 2**50), (True, 2**20)]
)
def test_pure_python_protobuf_reads_large_aligned_responses(tmp_path, joined, watermark):
    # Its parser matches tags by their bytes: a padded tag would drop the entry silently.
    # Joined rows come after an overlong watermark varint where alignment needs one.
    values = [bytes([n]) * size for n, size in enumerate([20_001, 3, 70_000, 2_100_003, 5])]
    path = tmp_path / "reply.bin"
    path.write_bytes(_lookup_response(values, watermark, joined_rows=joined))
    script = (
        "import sys; from ember.v1 import parameter_server_pb2 as pb; "
        "from google.protobuf.internal import api_implementation as api; "
        "m = pb.LookupResponse.FromString(open(sys.argv[1], 'rb').read()); "
        "print(api.Type(), m.watermark, len(m.rows), "
        "[(len(v), v[:1].hex()) for v in m.values])"
    )
    env = {**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}
    out = subprocess.run(
        [sys.executable, "-c", script, str(path)], env=env, capture_output=True, text=True,
        check=True,
    ).stdout.split(" ", 3)  # fmt: skip
    assert out[:2] == ["python", str(watermark)]
    if joined:  # the rows whole, and no values
        assert out[2] == str(sum(map(len, values))) and out[3].strip() == "[]"
    else:
        assert out[2] == "0" and out[3].strip() == str([(len(v), v[:1].hex()) for v in values])


@pytest.mark.parametrize("watermark", [-1, 0, 5, 127, 2**20, 2**27, 2**40, 2**50, -(2**63)])
@pytest.mark.parametrize("size", [1, 3, 16_384, 2**21 - 7, 2**21, 3 << 21])
def test_joined_rows_start_aligned_at_any_watermark_and_size(watermark, size):
    # Up to a 4-byte length varint (256 MiB): beyond the length's own padding room.
    encoded = _lookup_response([bytes(size)], watermark, joined_rows=True)
    assert (len(encoded) - size) % 4 == 0  # the rows are the message's last field
    parsed = pb.LookupResponse.FromString(encoded)
    assert parsed.watermark == watermark and len(parsed.rows) == size and not parsed.values
    view = decode_lookup_response(encoded)
    assert view.watermark == watermark and len(view.rows) == size


_NESTING_PLACES = {  # where groups may sit: a message at the top, or one of its sub-messages
    "LookupRequest": (decode_lookup_request, pb.LookupRequest, None),
    "LookupRequest.tables": (decode_lookup_request, pb.LookupRequest, 1),
    "LookupRequest.clock": (decode_lookup_request, pb.LookupRequest, 2),
    "UpdateRequest": (decode_update_request, pb.UpdateRequest, None),
    "UpdateRequest.tables": (decode_update_request, pb.UpdateRequest, 1),
    "UpdateRequest.refresh": (decode_update_request, pb.UpdateRequest, 3),
    "UpdateResponse": (decode_update_response, pb.UpdateResponse, None),
    "UpdateResponse.refreshed": (decode_update_response, pb.UpdateResponse, 2),
}


@pytest.mark.parametrize("depth", [99, 100, 101])
@pytest.mark.parametrize("place", list(_NESTING_PLACES))
def test_groups_nested_near_the_limit_are_refused_exactly_where_protobuf_refuses_them(depth, place):
    # protobuf counts sub-messages and the groups inside them towards one nesting limit
    decode, message, number = _NESTING_PLACES[place]
    groups = b"\x4b" * depth + b"\x4c" * depth  # field 9, unknown to every message here
    data = groups if number is None else len_field(number, len(groups)) + groups
    try:
        message.FromString(data)
    except DecodeError:
        with pytest.raises(InvalidArgumentError):
            decode(data)
    else:
        decode(data)
