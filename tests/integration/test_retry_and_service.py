"""Retries, deduplication of request ids, health and reflection on real shards."""

import socket
import sys
import threading

import grpc
import numpy as np
import pytest
import torch
from ember.ps_server import cluster as cluster_module
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.cluster import ClusterError, LocalCluster
from ember.ps_server.errors import PSClientError, Status
from ember.ps_server.local_ports import EPHEMERAL_RANGE, LOWEST_PORT, restartable_port
from ember.ps_server.shard.initializers import initial_rows
from ember.ps_server.wire.messages import SERVICE_NAME, encode_ids, pb, pb_grpc
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc


def test_a_retried_request_id_is_applied_once(table_name):
    spec = TableSpec(table_name, dim=4, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=1.0))
    owned = np.array([0, 1, 2], dtype=np.int64)  # a single shard owns every id
    with LocalCluster(1) as single, grpc.insecure_channel(single.endpoints[0]) as channel:
        stub = pb_grpc.ParameterServerStub(channel)
        stub.CreateTable(pb.CreateTableRequest(spec=spec.to_proto()), timeout=10)
        grads = np.full((3, 4), 0.25, dtype=np.float32)
        request = pb.PushRequest(
            table=table_name, ids=encode_ids(owned), grads=grads.tobytes(), request_id="req-1"
        )
        first = stub.Push(request, timeout=10)
        again = stub.Push(request, timeout=10)  # as a client does after losing the first reply
        assert (first.duplicate, first.rows_updated) == (False, 3)
        assert (again.duplicate, again.rows_updated) == (True, 0)
        reply = stub.Pull(pb.PullRequest(table=table_name, ids=encode_ids(owned)), timeout=10)
        values = np.frombuffer(reply.values, dtype=np.float32).reshape(3, 4)
        np.testing.assert_allclose(values, initial_rows(spec, owned).numpy() - 0.25, rtol=1e-6)
        assert np.frombuffer(reply.versions, dtype=np.int64).tolist() == [1, 1, 1]


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_shard_fails_with_one_clear_error_naming_it():
    endpoint = f"127.0.0.1:{_unused_port()}"
    config = ClientConfig(timeout_s=2.0, max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02)
    with PSClient([endpoint], config) as client, pytest.raises(PSClientError) as info:
        client.create_table(TableSpec("t", dim=4))
    error = info.value
    assert error.endpoint == endpoint and error.code == Status.UNAVAILABLE
    assert endpoint in str(error) and "gave up after 3 attempts" in str(error)


def test_client_retries_a_push_through_a_shard_restart(table_name):
    """A shard that comes back on the same port gets the retried push, applied once: the
    default retry policy outlasts a shard's start."""
    port = _unused_port()
    spec = TableSpec(table_name, dim=4, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=1.0))
    config = ClientConfig(timeout_s=5.0)
    with PSClient([f"127.0.0.1:{port}"], config) as client:
        pushed = threading.Event()
        failure = []

        def push_while_down():
            try:
                client.create_table(spec)
                client.push(table_name, [7], torch.ones(1, 4))
            except Exception as error:  # noqa: BLE001 - reported by the assertion below
                failure.append(error)
            pushed.set()

        thread = threading.Thread(target=push_while_down)
        thread.start()
        with LocalCluster(1, extra_args=["--port", str(port)]):
            assert pushed.wait(timeout=60)
            thread.join()
            assert not failure
            rows, versions = client.pull_with_versions(table_name, [7])
    expected = initial_rows(spec, np.array([7])) - 1.0
    torch.testing.assert_close(rows, expected)
    assert versions.tolist() == [1]


@pytest.mark.parametrize("ids", [[1], list(range(64))], ids=["one shard", "both shards"])
def test_a_closed_clients_calls_end_cancelled(cluster, table_name, ids):
    client = PSClient(cluster.endpoints)
    client.create_table(TableSpec(table_name, dim=4))
    client.close()
    with pytest.raises(PSClientError) as info:
        client.pull(table_name, ids)
    assert info.value.code == Status.CANCELLED and "closed" in info.value.details


def test_health_reports_serving(cluster):
    with grpc.insecure_channel(cluster.endpoints[1]) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICE_NAME):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_the_service(cluster):
    with grpc.insecure_channel(cluster.endpoints[0]) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (reply,) = list(stub.ServerReflectionInfo(iter([request]), timeout=10))
        names = {s.name for s in reply.list_services_response.service}
    assert {SERVICE_NAME, "grpc.health.v1.Health"} <= names


def test_a_shard_started_on_a_port_in_use_fails_instead_of_sharing_it(cluster):
    """gRPC binds with SO_REUSEPORT by default on Linux: a second shard process on the port
    would silently take a share of the clients' connections."""
    port = cluster.endpoints[0].rsplit(":", 1)[1]
    with (
        pytest.raises(ClusterError, match=f"Failed to bind to address 127.0.0.1:{port}"),
        LocalCluster(1, extra_args=["--port", port]),
    ):
        pass


def test_local_ports_lie_below_the_kernels_ephemeral_range():
    """Where no connection or port-0 bind is given them, so a restarted shard finds its
    port free; where the host is not this namespace's, the shard picks its own."""
    ephemeral_start = int(EPHEMERAL_RANGE.read_text().split()[0])
    if ephemeral_start - LOWEST_PORT < 1_000:
        pytest.skip(f"the ephemeral range here starts at {ephemeral_start}: no room below it")
    ports = {restartable_port() for _ in range(20)}
    assert all(LOWEST_PORT <= port < ephemeral_start for port in ports) and len(ports) > 1
    with LocalCluster(2) as cluster:
        chosen = [int(endpoint.rsplit(":", 1)[1]) for endpoint in cluster.endpoints]
        assert all(LOWEST_PORT <= port < ephemeral_start for port in chosen)
    assert restartable_port("192.0.2.1") == 0  # not an address of this host: bind port 0


def test_a_shard_whose_chosen_port_was_taken_meanwhile_starts_on_another(monkeypatch):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        held = taken.getsockname()[1]
        choices = iter([held])
        monkeypatch.setattr(
            cluster_module, "restartable_port", lambda host, ports: next(choices, 0)
        )
        with LocalCluster(1) as cluster, PSClient(cluster.endpoints) as client:
            assert int(cluster.endpoints[0].rsplit(":", 1)[1]) != held
            client.create_table(TableSpec("moved", dim=4))


def test_a_failure_after_an_earlier_runs_bind_failure_is_not_taken_for_one(tmp_path):
    """A reused workdir's shard log holds earlier runs: only what the latest launch wrote
    tells a bind failure, so another failure is raised at once, not launched again."""
    (tmp_path / "shard-0.log").write_text("Failed to bind to address 127.0.0.1:12345\n")
    launches = tmp_path / "launches"
    failing = [sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write('x'); sys.exit(3)"]
    with (
        pytest.raises(ClusterError, match="exited with 3") as refused,
        LocalCluster(1, workdir=tmp_path, server_command=[*failing, str(launches)]),
    ):
        pass
    assert launches.read_text() == "x"
    assert "Failed to bind" not in str(refused.value)
