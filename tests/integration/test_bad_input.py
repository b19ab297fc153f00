"""Every bad input gets a precise status and message, and changes nothing."""

import grpc
import numpy as np
import pytest
import torch
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.errors import PSClientError, Status
from ember.ps_server.routing import shard_of
from ember.ps_server.wire.messages import encode_ids, pb, pb_grpc
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec


@pytest.fixture
def table(client, table_name):
    spec = TableSpec(table_name, dim=4, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=0.1))
    client.create_table(spec)
    return spec


@pytest.fixture
def stubs(cluster):
    channels = [grpc.insecure_channel(e) for e in cluster.endpoints]
    yield [pb_grpc.ParameterServerStub(c) for c in channels]
    for channel in channels:
        channel.close()


def _owned(table: str, shard: int, count: int) -> np.ndarray:
    ids = np.arange(10 * count, dtype=np.int64)
    return ids[shard_of(table, ids, 2) == shard][:count]


def _status(call, request):
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=10)
    return info.value.code(), info.value.details()


def test_unknown_table_is_not_found(stubs):
    code, details = _status(
        stubs[0].Pull, pb.PullRequest(table="missing", ids=encode_ids(np.array([1])))
    )
    assert code == grpc.StatusCode.NOT_FOUND and "'missing' does not exist" in details


def test_byte_lengths_are_invalid_argument(stubs, table):
    ids = _owned(table.name, 0, 2)
    code, details = _status(stubs[0].Pull, pb.PullRequest(table=table.name, ids=b"\x01\x02\x03"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "multiple of 8" in details
    bad = pb.PushRequest(table=table.name, ids=encode_ids(ids), grads=bytes(12), request_id="x")
    code, details = _status(stubs[0].Push, bad)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "= 32 bytes, got 12" in details


def test_nan_gradient_is_invalid_argument_and_changes_no_row(stubs, client, table):
    ids = _owned(table.name, 0, 3)
    before = client.pull_with_versions(table.name, ids)
    grads = np.ones((3, 4), dtype=np.float32)
    grads[1, 2] = np.nan
    request = pb.PushRequest(
        table=table.name, ids=encode_ids(ids), grads=grads.tobytes(), request_id="nan"
    )
    code, details = _status(stubs[0].Push, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "NaN or Inf" in details
    after = client.pull_with_versions(table.name, ids)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])


@pytest.mark.parametrize("request_id", ["", "x" * 257, "tab\there", "job-a@0"])
def test_a_write_needs_a_short_printable_request_id(stubs, client, table, request_id):
    """A request id is remembered per table and logged: an empty, huge or unprintable one,
    or one shaped like a step clock's (``job@clock``, which would make that clock's update
    look applied), is refused by Push, PushBatch and Assign, and changes nothing."""
    ids = _owned(table.name, 0, 2)
    rows = np.ones((2, 4), dtype=np.float32).tobytes()
    before = client.pull_with_versions(table.name, ids)
    push = pb.PushRequest(table=table.name, ids=encode_ids(ids), grads=rows, request_id=request_id)
    assign = pb.AssignRequest(
        table=table.name, ids=encode_ids(ids), values=rows, request_id=request_id
    )
    for call, request in (
        (stubs[0].Push, push),
        (stubs[0].PushBatch, pb.PushBatchRequest(requests=[push])),
        (stubs[0].Assign, assign),
    ):
        code, details = _status(call, request)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "request_id of 1..256 printable characters without '@'" in details
    after = client.pull_with_versions(table.name, ids)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
    push.request_id = "x" * 256
    assert stubs[0].Push(push, timeout=10).rows_updated == 2


def test_client_rejects_bad_input_before_sending(client, table):
    with pytest.raises(ValueError, match="NaN or Inf"):
        client.push(table.name, [1], [[0.0, float("nan"), 0.0, 0.0]])
    with pytest.raises(ValueError, match="shape"):
        client.push(table.name, [1, 2], torch.zeros(2, 5))
    with pytest.raises(ValueError, match=">= 0"):
        client.pull(table.name, torch.tensor([3, -1]))
    with pytest.raises(ValueError, match="integer"):
        client.pull(table.name, torch.tensor([1.0, 2.0]))
    assert (
        sum(
            t.counters.push_requests
            for s in client.stats()
            for t in s.tables
            if t.name == table.name
        )
        == 0
    )


def test_empty_ids_are_ok(stubs, client, table):
    reply = stubs[0].Pull(pb.PullRequest(table=table.name, ids=b""), timeout=10)
    assert reply.values == b"" and reply.versions == b"" and reply.dim == 4
    assert client.pull(table.name, []).shape == (0, 4)
    client.push(table.name, [], torch.zeros(0, 4))


def test_foreign_ids_are_failed_precondition(stubs, client, table):
    foreign = _owned(table.name, 1, 3)
    code, details = _status(
        stubs[0].Pull, pb.PullRequest(table=table.name, ids=encode_ids(foreign))
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "endpoint list" in details
    rows = {t.name: t.rows for s in client.stats() for t in s.tables}
    assert rows[table.name] == 0


def test_request_over_the_limit_is_resource_exhausted(table_name):
    limit = 1 << 17
    with (
        LocalCluster(1, extra_args=["--max-message-bytes", str(limit)]) as cluster,
        grpc.insecure_channel(cluster.endpoints[0]) as channel,
    ):
        stub = pb_grpc.ParameterServerStub(channel)
        stub.CreateTable(
            pb.CreateTableRequest(spec=TableSpec(table_name, dim=4).to_proto()), timeout=10
        )
        oversized = pb.PullRequest(table=table_name, ids=encode_ids(np.arange(limit // 8 + 10)))
        code, _ = _status(stub.Pull, oversized)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        big_reply = pb.PullRequest(
            table=table_name, ids=encode_ids(np.arange(limit // 16))
        )  # 64 KiB asks for a 192 KiB reply
        code, details = _status(stub.Pull, big_reply)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "split the ids" in details


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            pb.TableSpec(name="d", dim=0, optimizer=pb.Optimizer(kind=1, lr=0.1)),
            "dim must be in 1..4096",
        ),
        (
            pb.TableSpec(name="o", dim=4, optimizer=pb.Optimizer(kind=9, lr=0.1)),
            "unknown optimizer kind 9",
        ),
        (
            pb.TableSpec(name="l", dim=4, optimizer=pb.Optimizer(kind=1, lr=-0.1)),
            "lr must be > 0.0",
        ),
    ],
)
def test_invalid_table_spec_is_invalid_argument(stubs, spec, message):
    code, details = _status(stubs[0].CreateTable, pb.CreateTableRequest(spec=spec))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message in details


def test_create_table_is_idempotent_and_refuses_another_spec(client, table):
    client.create_table(table)
    with pytest.raises(PSClientError) as info:
        client.create_table(TableSpec(table.name, dim=8))
    assert info.value.code == Status.ALREADY_EXISTS
    assert info.value.endpoint in client.endpoints
    assert [s for s in client.list_tables() if s.name == table.name] == [table]


def test_client_with_shards_in_the_wrong_order_is_refused(cluster, table_name):
    with (
        PSClient(list(reversed(cluster.endpoints))) as wrong,
        pytest.raises(PSClientError, match="pass endpoints in shard order") as info,
    ):
        wrong.create_table(TableSpec(table_name, dim=4))
    assert info.value.code == Status.FAILED_PRECONDITION
