"""The token rule on the UCX listener: a connection presents the token first, or nothing of
it is read or applied."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.client.step_client import StepClient
from ember.ps_server.client.step_job import StepJob
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.errors import PSClientError, Status
from ember.ps_server.security.credentials import authorization_value
from ember.ps_server.wire.frames import END_MARK, FrameHeader, Op
from ember.ps_server.wire.messages import encode_ids
from ember.ps_server.wire.step_codec import StepClockView, encode_update_request
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec

from tests.support.raw_frames import RawFrames, require_ucx

TOKEN = "ucx-token-0123456789abcdef"
DIM = 4
IDS = np.array([5, 6, 7])


@pytest.fixture(scope="module")
def token_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("token") / "token"
    path.write_text(TOKEN)
    path.chmod(0o600)
    return str(path)


@pytest.fixture(scope="module")
def ucx_shard(token_file) -> Iterator[LocalCluster]:
    require_ucx()
    with LocalCluster(1, ["--ucx", "--token-file", token_file]) as cluster:
        yield cluster


def _hello(token: str) -> tuple[bytes, bytes]:
    message = (authorization_value(token.encode()) if token else "").encode() + END_MARK
    return FrameHeader(Op.HELLO, 1, len(message)).encode(), message


def _update(table: str) -> tuple[bytes, bytes]:
    grads = np.ones((len(IDS), DIM), dtype=np.float32)
    clock = StepClockView(f"raw-{uuid.uuid4().hex}", 1, 0, 0, 2, 1000)
    update = encode_update_request([(table, encode_ids(IDS), grads)], clock, trailer=END_MARK)
    return FrameHeader(Op.UPDATE, 2, len(update), tables=1, clock=0).encode(), update


@pytest.fixture
def raw_to_shard(ucx_shard, token_file, table_name):
    """A client with the token, the table, its rows before, and a raw UCX connection."""
    config = ClientConfig(token_file=token_file, max_attempts=1, timeout_s=20)
    spec = TableSpec(table_name, dim=DIM, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=1.0))
    with PSClient(ucx_shard.endpoints, config) as client:
        client.create_table(spec)
        before = client.pull(table_name, torch.from_numpy(IDS))
        (plane,) = client.stats(sizes=False)[0].data_planes
        raw = RawFrames("127.0.0.1", plane.port)
        try:
            yield client, raw, before
        finally:
            raw.close()


def test_step_calls_over_ucx_present_the_token_and_work(ucx_shard, token_file, table_name):
    config = ClientConfig(transport="ucx", token_file=token_file, max_attempts=1, timeout_s=20)
    spec = TableSpec(table_name, dim=DIM, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=1.0))
    with PSClient(ucx_shard.endpoints, config) as client:
        client.create_table(spec)
        steps = StepClient(client, StepJob(f"job-{uuid.uuid4().hex}", wait_s=30))
        ids = torch.tensor([3, 1, 4])
        before, _ = steps.lookup({table_name: ids}, clock=-1)
        steps.update({table_name: (ids, torch.ones(3, DIM))}, clock=0)
        after, _ = steps.lookup({table_name: ids}, clock=0)
        assert client.shard_rpc.data_plane.name == "ucx"
    torch.testing.assert_close(after[table_name], before[table_name] - 1.0)


def test_a_raw_update_after_the_token_is_applied(raw_to_shard, table_name):
    """The control for the refusals below: the same frames work once the token is shown."""
    client, raw, before = raw_to_shard
    reply, _ = raw.exchange(*_hello(TOKEN))
    assert reply.status == Status.OK
    reply, message = raw.exchange(*_update(table_name))
    assert reply.status == Status.OK, message
    again, _ = raw.exchange(*_hello(TOKEN))  # only a connection's first frame
    assert again.status == Status.INVALID_ARGUMENT
    torch.testing.assert_close(client.pull(table_name, torch.from_numpy(IDS)), before - 1.0)


@pytest.mark.parametrize("token", ["wrong-token-0123456789", ""], ids=["wrong", "empty"])
def test_a_wrong_or_empty_token_is_refused_and_nothing_is_applied(raw_to_shard, table_name, token):
    client, raw, before = raw_to_shard
    reply, message = raw.exchange(*_hello(token))
    assert reply.status == Status.UNAUTHENTICATED
    assert ("wrong token" if token else "no token") in message.decode()
    raw.reconnect()  # the listener closed that connection
    header, _ = _update(table_name)
    refused, message = raw.exchange(header, None)  # no HELLO: the header alone is refused
    assert refused.status == Status.UNAUTHENTICATED
    assert "present the token first" in message.decode()
    torch.testing.assert_close(client.pull(table_name, torch.from_numpy(IDS)), before)


def test_a_short_hello_cannot_borrow_an_earlier_connections_token(raw_to_shard, table_name):
    """A HELLO announcing the right length but carrying one byte must not be completed by what
    an earlier, genuine HELLO left in memory."""
    client, raw, before = raw_to_shard
    reply, _ = raw.exchange(*_hello(TOKEN))  # a genuine one first, on another connection
    assert reply.status == Status.OK
    raw.reconnect()
    length = len(_hello(TOKEN)[1])
    reply, _ = raw.exchange(FrameHeader(Op.HELLO, 1, length).encode(), b"B")
    assert reply is None or reply.status == Status.UNAUTHENTICATED
    torch.testing.assert_close(client.pull(table_name, torch.from_numpy(IDS)), before)


def test_a_client_with_the_wrong_token_fails_unauthenticated_without_retrying(
    ucx_shard, token_file, table_name, tmp_path
):
    with PSClient(ucx_shard.endpoints, ClientConfig(token_file=token_file)) as owner:
        owner.create_table(TableSpec(table_name, dim=DIM))
    wrong = tmp_path / "wrong"
    wrong.write_text("wrong-token-0123456789")
    config = ClientConfig(transport="ucx", token_file=str(wrong), max_attempts=5, timeout_s=20)
    with PSClient(ucx_shard.endpoints, config) as client, pytest.raises(PSClientError) as refused:
        client.ensure_topology()
    assert refused.value.code is Status.UNAUTHENTICATED  # gRPC refuses it first
