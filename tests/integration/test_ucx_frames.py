"""A shard's UCX listener against frames that lie: each is refused, logged, and costs nothing
but its own endpoint; afterwards the shard answers correctly and no row has changed."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import torch
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.errors import Status
from ember.ps_server.routing import shard_of
from ember.ps_server.wire.frames import END_MARK, MIXED_DTYPES, NO_CLOCK, FrameHeader, Op
from ember.ps_server.wire.messages import encode_ids
from ember.ps_server.wire.row_dtype import RowDtype
from ember.ps_server.wire.step_codec import (
    StepClockView,
    decode_lookup_response,
    encode_lookup_request,
    encode_update_request,
)
from ember.ps_server.wire.table_spec import TableSpec

from tests.support.raw_frames import RawFrames, assert_ucx_lookup_matches_pull, require_ucx

DIM = 4
FUZZ_FRAMES = 5_000
FUZZ_BOUND_S = 300.0


@pytest.fixture
def shard0(cluster, table_name):
    """A client, a raw endpoint to shard 0's listener, ids that shard 0 owns, and the table."""
    require_ucx()
    with PSClient(cluster.endpoints) as client:
        client.create_table(TableSpec(table_name, dim=DIM))
        (plane,) = client.stats(sizes=False)[0].data_planes
        ids = np.arange(4000)
        ids = ids[shard_of(table_name, ids, client.num_shards) == 0][:64]
        before = client.pull_with_versions(table_name, torch.from_numpy(ids))
        raw = RawFrames(cluster.endpoints[0].rsplit(":", 1)[0], plane.port)
        try:
            yield client, raw, ids, table_name
        finally:
            raw.close()
        after = client.pull_with_versions(table_name, torch.from_numpy(ids))
        assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])


def _update(table: str, ids: np.ndarray, clock: int) -> bytes:
    grads = np.ones((len(ids), DIM), dtype=np.float32)
    job = StepClockView(f"fuzz-{clock}", 1, 0, clock, 2, 1000)
    return encode_update_request([(table, encode_ids(ids), grads)], job, trailer=END_MARK)


def _frame(op: Op, payload: bytes, **fields) -> bytes:
    return FrameHeader(op, 7, len(payload), **fields).encode()


def _assert_refused(reply, status: Status, words: str) -> None:
    assert reply is not None, "the shard closed the endpoint instead of answering"
    header, message = reply
    assert header.status == status, (header, message)
    assert words in message.decode(), message


def test_a_header_that_disagrees_with_its_message_is_refused_and_the_endpoint_goes_on(shard0):
    client, raw, ids, table = shard0
    payload = _update(table, ids, 0)
    for fields, words in [
        ({"tables": 2, "clock": 0}, "names 2 tables, its message 1"),
        ({"tables": 1, "clock": 5}, "carries clock 5, its message 0"),
        (
            {"tables": 1, "clock": 0, "dtype": RowDtype.BFLOAT16},
            "dtype bfloat16, its message float32",
        ),
        ({"tables": 1, "clock": 0, "dtype": MIXED_DTYPES}, "dtype mixed, its message float32"),
    ]:
        _assert_refused(raw.exchange(_frame(Op.UPDATE, payload, **fields), payload),
                        Status.INVALID_ARGUMENT, words)  # fmt: skip
    request = encode_lookup_request([(table, encode_ids(ids))], None, END_MARK)
    header, message = raw.exchange(_frame(Op.LOOKUP, request, tables=1), request)
    assert header.status == Status.OK and raw.reconnects == 1  # the same endpoint answered
    rows = np.frombuffer(decode_lookup_response(message).values[0], dtype="<f4").copy()
    assert torch.equal(torch.from_numpy(rows.reshape(-1, DIM)), client.pull(table, ids))


def test_gradients_whose_bytes_do_not_fit_their_dtype_or_an_unknown_dtype_are_refused(shard0):
    _, raw, ids, table = shard0
    job = StepClockView("dtype-lies", 1, 0, 0, 2, 1000)
    float32_grads = np.ones((len(ids), DIM), dtype=np.float32)  # 4-byte elements
    for entry, header_dtype, words in [
        ((table, encode_ids(ids), float32_grads, RowDtype.FLOAT16), RowDtype.FLOAT16,
         f"{len(ids)} ids x dim {DIM} float16 = {len(ids) * DIM * 2} bytes"),
        ((table, encode_ids(ids), float32_grads, 7), RowDtype.FLOAT32, "its message 7 (unknown)"),
    ]:  # fmt: skip
        payload = encode_update_request([entry], job, trailer=END_MARK)
        frame = _frame(Op.UPDATE, payload, tables=1, clock=0, dtype=header_dtype)
        _assert_refused(raw.exchange(frame, payload), Status.INVALID_ARGUMENT, words)


def test_an_unreadable_header_or_a_short_payload_ends_only_its_endpoint(shard0):
    client, raw, ids, table = shard0
    lookup = encode_lookup_request([("t", encode_ids(ids))], None, END_MARK)
    invalid, too_large = Status.INVALID_ARGUMENT, Status.RESOURCE_EXHAUSTED
    bad_headers = [
        (b"GET / HTTP/1.1\r\n" + bytes(20), invalid, "not an Ember frame"),
        (_frame(Op.LOOKUP, lookup)[:5] + bytes([9]) + _frame(Op.LOOKUP, lookup)[6:], invalid,
         "op 9"),
        (_frame(Op.LOOKUP, lookup, status=Status.INTERNAL), invalid,
         "request carries status INTERNAL"),
        (FrameHeader(Op.LOOKUP, 7, 1 << 40).encode(), too_large, "outside"),  # as gRPC says
    ]  # fmt: skip
    for header, status, words in bad_headers:
        _assert_refused(raw.exchange(header, None), status, words)
        raw.reconnect()
    short = FrameHeader(Op.LOOKUP, 7, len(lookup) + 16, tables=1).encode()
    _assert_refused(raw.exchange(short, lookup), Status.INVALID_ARGUMENT, "shorter")
    raw.reconnect()
    assert_ucx_lookup_matches_pull(client, table, torch.from_numpy(ids))


def test_five_thousand_malformed_frames_change_no_row_and_the_shard_serves_on(shard0):
    client, raw, ids, table = shard0
    rng = random.Random(20261201)
    statuses: dict[str, int] = {}
    started = time.monotonic()
    for n in range(FUZZ_FRAMES):
        assert time.monotonic() - started < FUZZ_BOUND_S, f"only {n} frames in {FUZZ_BOUND_S} s"
        kind = rng.random()
        if kind < 0.4:  # a real update whose header lies about it
            clock = rng.randint(0, 3)
            payload = _update(table, ids[: rng.randint(1, len(ids))], clock)
            lie = rng.choice([
                {"tables": rng.choice([0, 2, 9]), "clock": clock},
                {"tables": 1, "clock": rng.choice([NO_CLOCK, clock + 1])},
                {"tables": 1, "clock": clock, "dtype": RowDtype.FLOAT16},
            ])  # fmt: skip
            reply = raw.exchange(_frame(Op.UPDATE, payload, **lie), payload)
        elif kind < 0.75:  # random bytes as a lookup or an update
            payload = rng.randbytes(rng.randint(0, 300)) + END_MARK
            op = rng.choice([Op.LOOKUP, Op.UPDATE])
            # At least one table: random bytes can be a valid lookup of no table (empty, or
            # unknown fields only; the decoders skip those), which a header of 0 tables and
            # no clock would rightly have answered OK.
            reply = raw.exchange(_frame(op, payload, tables=rng.randint(1, 3)), payload)
        elif kind < 0.9:  # a valid message cut short of what its header says
            payload = _update(table, ids, 0)
            cut = rng.randint(len(END_MARK), len(payload) - 1)
            reply = raw.exchange(_frame(Op.UPDATE, payload, tables=1, clock=0), payload[:cut])
        else:  # a header of noise between a correct magic and version and its end mark
            reply = raw.exchange(b"EMBF\x01" + rng.randbytes(31) + END_MARK, None)
        status = "closed" if reply is None else reply[0].status.name
        assert status != "OK", f"frame {n} was accepted"
        statuses[status] = statuses.get(status, 0) + 1
        if reply is None or kind >= 0.75:
            raw.reconnect()
    print(f"{FUZZ_FRAMES} frames in {time.monotonic() - started:.1f} s: {statuses}")
    assert statuses.get("INVALID_ARGUMENT", 0) > FUZZ_FRAMES // 2
    assert_ucx_lookup_matches_pull(client, table, torch.from_numpy(ids))
