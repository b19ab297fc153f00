"""Mutated encodings of valid data-path messages through the codecs.

The zero-copy codecs must accept exactly what protobuf accepts, with the same
field values; every request decoder must fail only with InvalidArgumentError.
12,000 seeded mutations, a few seconds.
"""

import random

import numpy as np
import pytest
from ember.ps_server.errors import InvalidArgumentError
from ember.ps_server.shard.servicer import _decoder
from ember.ps_server.wire.messages import pb
from ember.ps_server.wire.pull_push_codec import (
    decode_pull_reply,
    decode_push_request,
    encode_pull_reply,
    encode_push_request,
)
from google.protobuf.message import DecodeError

from tests.support.mutations import mutated

IDS = np.array([3, 1 << 40, 7], dtype="<i8")
ROWS = np.linspace(-1, 1, 12, dtype="<f4").reshape(3, 4)
PUSH = encode_push_request("table.a", IDS, ROWS, "client:17:table.a:0:0")
PULL_REPLY = encode_pull_reply(ROWS, np.array([1, 0, 9], dtype="<i8"), 4)
PULL = pb.PullRequest(table="table.a", ids=IDS.tobytes()).SerializeToString()
PUSH_BATCH = pb.PushBatchRequest(
    requests=[pb.PushRequest.FromString(PUSH), pb.PushRequest(table="b", ids=b"", grads=b"")]
).SerializeToString()
PULL_BATCH = pb.PullBatchRequest(
    requests=[pb.PullRequest.FromString(PULL), pb.PullRequest(table="b", ids=IDS[:1].tobytes())]
).SerializeToString()
STALE_BATCH = pb.PullStaleBatchRequest(
    requests=[
        pb.PullStaleRequest(table="table.a", ids=IDS.tobytes(), held_versions=bytes(24), bound=2)
    ]
).SerializeToString()


def _outcome(decode, data):
    try:
        return True, decode(data)
    except (InvalidArgumentError, DecodeError) as error:
        return False, error


@pytest.mark.parametrize(
    ("valid", "ours", "fields"),
    [
        (PUSH, decode_push_request, ("table", "ids", "grads", "request_id")),
        (PULL_REPLY, decode_pull_reply, ("values", "versions", "dim")),
    ],
    ids=["push-request", "pull-reply"],
)
def test_the_zero_copy_codecs_accept_exactly_what_protobuf_accepts(valid, ours, fields):
    reference = (pb.PushRequest if ours is decode_push_request else pb.PullResponse).FromString
    rng = random.Random(fields[0])
    accepted = rejected = 0
    for _ in range(4000):
        data = mutated(valid, rng)
        ok, view = _outcome(ours, data)
        expected_ok, message = _outcome(reference, data)
        assert ok == expected_ok, (data.hex(), view, message)
        if not ok:
            assert isinstance(view, InvalidArgumentError), view
            rejected += 1
            continue
        accepted += 1
        for field in fields:
            value = getattr(view, field)
            assert (bytes(value) if isinstance(value, memoryview) else value) == getattr(
                message, field
            ), (data.hex(), field)
    assert accepted > 500 and rejected > 500  # the mutations reach both sides


@pytest.mark.parametrize(
    ("valid", "message"),
    [
        (PULL, pb.PullRequest),
        (PUSH_BATCH, pb.PushBatchRequest),
        (PULL_BATCH, pb.PullBatchRequest),
        (STALE_BATCH, pb.PullStaleBatchRequest),
    ],
    ids=lambda value: getattr(value, "__name__", ""),
)
def test_request_decoders_reject_bad_bytes_only_as_invalid_argument(valid, message):
    decode, rng = _decoder(message), random.Random(message.__name__)
    outcomes = set()
    for _ in range(1000):
        data = mutated(valid, rng)
        try:
            decode(data)
            outcomes.add("ok")
        except InvalidArgumentError as error:
            assert f"malformed {message.DESCRIPTOR.name}" in str(error)
            outcomes.add("invalid")
    assert outcomes == {"ok", "invalid"}
