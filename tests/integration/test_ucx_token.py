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
from ember.ps_server.client.step_client import StepClient, StepJob
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.errors import Status
from ember.ps_server.security.credentials import authorization_value
from ember.ps_server.wire.frames import END_MARK, FrameHeader, Op
from ember.ps_server.wire.messages import encode_ids
from ember.ps_server.wire.step_codec import StepClockView, encode_update_request
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec

from tests.support.raw_frames import RawFrames, require_ucx

TOKEN = "ucx-token-0123456789abcdef"
DIM = 4


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


@pytest.mark.parametrize(
    "hello", [None, "wrong-token-0123456789", ""], ids=["none", "wrong", "empty"]
)
def test_a_connection_without_the_token_is_refused_and_nothing_is_applied(
    ucx_shard, token_file, table_name, hello
):
    config = ClientConfig(token_file=token_file, max_attempts=1, timeout_s=20)
    with PSClient(ucx_shard.endpoints, config) as client:
        client.create_table(TableSpec(table_name, dim=DIM))
        ids = np.array([5, 6, 7])
        before = client.pull(table_name, torch.from_numpy(ids))
        (plane,) = client.stats(sizes=False)[0].data_planes
        raw = RawFrames("127.0.0.1", plane.port)
        try:
            if hello is not None:
                message = (authorization_value(hello.encode()) if hello else "").encode() + END_MARK
                header = FrameHeader(Op.HELLO, 1, len(message)).encode()
                reply = raw.exchange(header, message)
                assert reply is not None and reply[0].status == Status.UNAUTHENTICATED
                assert ("wrong token" if hello else "no token") in reply[1].decode()
                raw.reconnect()  # the listener closed that connection
            grads = np.ones((len(ids), DIM), dtype=np.float32)
            clock = StepClockView(f"intruder-{uuid.uuid4().hex}", 1, 0, 0, 2, 1000)
            update = encode_update_request(
                [(table_name, encode_ids(ids), grads)], clock, trailer=END_MARK
            )
            reply = raw.exchange(
                FrameHeader(Op.UPDATE, 2, len(update), tables=1, clock=0).encode(), update
            )
            # Refused unread: answered UNAUTHENTICATED, or (its payload never read) the
            # connection closed before the answer arrived.
            if reply is not None:
                assert reply[0].status == Status.UNAUTHENTICATED
                assert "present the token first" in reply[1].decode()
        finally:
            raw.close()
        torch.testing.assert_close(client.pull(table_name, torch.from_numpy(ids)), before)
