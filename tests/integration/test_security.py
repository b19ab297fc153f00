"""TLS, mutual TLS and the shared token on real shard processes."""

from __future__ import annotations

import dataclasses
import datetime
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.client.step_client import StepClient
from ember.ps_server.client.step_job import StepJob
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.errors import PSClientError, Status
from ember.ps_server.security.certs import make_certificates
from ember.ps_server.security.channels import open_channel
from ember.ps_server.wire.messages import SERVICE_NAME, pb
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVICE_METHODS = [m.name for m in pb.DESCRIPTOR.services_by_name["ParameterServer"].methods]
TOKEN = "s3cret-token-0123456789"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Path]]:
    """The cluster's CA, another CA, and a set whose certificates have expired."""
    root = tmp_path_factory.mktemp("pki")
    expired_start = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=30)
    token = root / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    return {
        "good": make_certificates(root / "good"),
        "other": make_certificates(root / "other"),
        "expired": make_certificates(
            root / "expired", days=1, not_before=expired_start, ca_dir=root / "good"
        ),
        "token": {"file": token},
    }


def _shard(pki, certs: str = "good", mutual: bool = False) -> LocalCluster:
    files = pki[certs]
    args = ["--tls-cert", str(files["server.pem"]), "--tls-key", str(files["server.key"])]
    args += ["--tls-client-ca", str(pki["good"]["ca.pem"])] if mutual else []
    return LocalCluster(1, [*args, "--token-file", str(pki["token"]["file"])])


@pytest.fixture(scope="module")
def tls_shard(pki) -> Iterator[LocalCluster]:
    with _shard(pki) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def mtls_shard(pki) -> Iterator[LocalCluster]:
    with _shard(pki, mutual=True) as cluster:
        yield cluster


def _config(pki, certs: str | None = "good", client_cert: bool = False, token: str | None = TOKEN,
            tmp: Path | None = None) -> ClientConfig:  # fmt: skip
    token_file = ""
    if token is not None:
        token_file = str(tmp / "client-token") if tmp else str(pki["token"]["file"])
        if tmp:
            Path(token_file).write_text(token)
    files = pki[certs] if certs else {}
    return ClientConfig(
        max_attempts=1,
        timeout_s=10,
        tls_ca=str(pki["good"]["ca.pem"]) if certs else "",
        tls_cert=str(files["client.pem"]) if client_cert else "",
        tls_key=str(files["client.key"]) if client_cert else "",
        token_file=token_file,
    )


def _exercise(endpoints: list[str], config: ClientConfig, table: str) -> torch.Tensor:
    """Create a table, push and pull over gRPC, then look up and update through the step
    calls; returns the rows read at the end."""
    spec = TableSpec(table, dim=4, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=1.0))
    ids = torch.tensor([1, 5, 9])
    with PSClient(endpoints, config) as client:
        client.create_table(spec)
        before = client.pull(table, ids)
        client.push(table, ids, torch.ones(3, 4))
        steps = StepClient(client, StepJob(f"job-{uuid.uuid4().hex}", wait_s=30))
        rows, _ = steps.lookup({table: ids}, clock=-1)
        torch.testing.assert_close(rows[table], before - 1.0)
        steps.update({table: (ids, torch.ones(3, 4))}, clock=0)
        return client.pull(table, ids)


def _pull(endpoints, config, table):
    with PSClient(endpoints, config) as client:
        return client.pull(table, torch.tensor([1, 5, 9]))


def test_tls_lookups_and_updates_work_with_the_token(tls_shard, pki, table_name):
    rows = _exercise(tls_shard.endpoints, _config(pki), table_name)
    assert rows.shape == (3, 4)


def test_mutual_tls_lookups_and_updates_work_with_a_client_certificate(mtls_shard, pki, table_name):
    _exercise(mtls_shard.endpoints, _config(pki, client_cert=True), table_name)


@pytest.mark.parametrize("token", [None, "wrong-token-0123456789", TOKEN[:-1] + "X"])
def test_a_call_without_the_right_token_is_unauthenticated_and_changes_nothing(
    tls_shard, pki, table_name, token, tmp_path
):
    _exercise(tls_shard.endpoints, _config(pki), table_name)
    before = _pull(tls_shard.endpoints, _config(pki), table_name)
    intruder = _config(pki, token=token, tmp=tmp_path)
    with PSClient(tls_shard.endpoints, intruder) as client, pytest.raises(PSClientError) as refused:
        client.push(table_name, torch.tensor([1, 5, 9]), torch.ones(3, 4))
    assert refused.value.code is Status.UNAUTHENTICATED
    assert ("no token" if token is None else "wrong token") in str(refused.value)
    torch.testing.assert_close(_pull(tls_shard.endpoints, _config(pki), table_name), before)


# An unknown method too: a caller without the token cannot tell which methods exist.
@pytest.mark.parametrize("method", [*SERVICE_METHODS, "NoSuchMethod"])
def test_every_method_refuses_a_wrong_token_before_reading_the_request(tls_shard, pki, method):
    """An empty request would be INVALID_ARGUMENT if it were read; the token is checked first."""
    ca = str(pki["good"]["ca.pem"])
    with open_channel(tls_shard.endpoints[0], (), ca, token=b"wrong-token-0123456789") as channel:
        call = channel.unary_unary(f"/{SERVICE_NAME}/{method}")
        with pytest.raises(grpc.RpcError) as refused:
            call(b"", timeout=10)
    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED, refused.value.details()
    assert "wrong token" in refused.value.details()


def test_health_answers_without_a_token(tls_shard, pki):
    credentials = grpc.ssl_channel_credentials(pki["good"]["ca.pem"].read_bytes())
    with grpc.secure_channel(tls_shard.endpoints[0], credentials) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    command = [sys.executable, "-m", "ember.cli.main", "health", tls_shard.endpoints[0]]
    checked = subprocess.run(
        [*command, "--tls-ca", str(pki["good"]["ca.pem"])],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (checked.returncode, checked.stdout.split()[-1]) == (0, "SERVING"), checked.stderr
    plaintext = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert plaintext.returncode == 1 and "UNAVAILABLE" in plaintext.stdout


@pytest.mark.parametrize(
    "client, message",
    [
        ("plaintext", "TLS"),  # a plaintext client of a TLS shard
        ("no client certificate", "client certificate"),
        ("client certificate of another CA", "client certificate"),
        ("expired client certificate", "client certificate"),
    ],
)
def test_mutual_tls_refuses_clients_it_cannot_verify_and_nothing_is_applied(
    mtls_shard, pki, table_name, client, message
):
    good = _config(pki, client_cert=True)
    _exercise(mtls_shard.endpoints, good, table_name)
    before = _pull(mtls_shard.endpoints, good, table_name)
    bad = {
        "plaintext": dataclasses.replace(good, tls_ca="", tls_cert="", tls_key=""),
        "no client certificate": dataclasses.replace(good, tls_cert="", tls_key=""),
        "client certificate of another CA": _config(pki, "other", client_cert=True),
        "expired client certificate": _config(pki, "expired", client_cert=True),
    }[client]
    bad = dataclasses.replace(bad, tls_ca=str(pki["good"]["ca.pem"])) if bad.tls_ca else bad
    with PSClient(mtls_shard.endpoints, bad) as intruder, pytest.raises(PSClientError) as refused:
        intruder.push(table_name, torch.tensor([1, 5, 9]), torch.ones(3, 4))
    assert refused.value.code is Status.UNAVAILABLE
    assert message in str(refused.value)
    torch.testing.assert_close(_pull(mtls_shard.endpoints, good, table_name), before)


@pytest.mark.parametrize(
    "server, reason", [("expired", "CERTIFICATE_VERIFY_FAILED"), ("other", "BAD_SIGNATURE")]
)
def test_a_client_refuses_a_shard_whose_certificate_it_cannot_verify(
    pki, server, reason, table_name
):
    with (
        _shard(pki, certs=server) as shard,
        PSClient(shard.endpoints, _config(pki)) as client,
        pytest.raises(PSClientError) as refused,
    ):
        client.pull(table_name, torch.tensor([1]))
    assert refused.value.code is Status.UNAVAILABLE
    assert reason in str(refused.value)
