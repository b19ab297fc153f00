"""A real shard whose write-ahead log cannot be written: it stops acknowledging writes, says
why, reports unhealthy, and a restart recovers every acknowledged write."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.errors import PSClientError, Status
from ember.ps_server.shard.initializers import initial_rows
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec
from grpc_health.v1 import health_pb2

from tests.support.health import serving_status
from tests.support.tmpfs import mounted_tmpfs

FAULTY_SHARD = Path(__file__).resolve().parents[1] / "support" / "faulty_disk_shard.py"
SPEC = TableSpec("logged", dim=64, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=0.5))
FAST = ClientConfig(max_attempts=2, initial_backoff_s=0.01)


def test_a_failed_fsync_stops_acknowledgements_and_the_shard_reports_why(tmp_path):
    trigger = tmp_path / "break-the-disk"
    command = [sys.executable, str(FAULTY_SHARD), str(trigger)]
    extra = ["--wal", str(tmp_path / "wal"), "--wal-fsync", "always"]
    with (
        LocalCluster(1, extra_args=extra, server_command=command) as cluster,
        PSClient(cluster.endpoints, FAST) as client,
    ):
        client.create_table(SPEC)
        client.push(SPEC.name, torch.arange(4), torch.ones(4, SPEC.dim))
        trigger.touch()
        with pytest.raises(PSClientError) as refused:
            client.push(SPEC.name, torch.arange(4), torch.ones(4, SPEC.dim))
        assert refused.value.code == Status.FAILED_PRECONDITION
        assert "fsync of the write-ahead log" in refused.value.details
        assert "Input/output error" in refused.value.details
        with pytest.raises(PSClientError, match="FAILED_PRECONDITION.*stopped serving.*fsync"):
            client.push(SPEC.name, torch.arange(4), torch.ones(4, SPEC.dim))
        assert serving_status(cluster.endpoints[0]) == health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs."""
    with mounted_tmpfs(tmp_path / "disk", "1m"):
        yield tmp_path / "disk"


def test_a_disk_that_fills_mid_record_keeps_every_acknowledged_write(small_disk, tmp_path):
    ids = torch.arange(64)
    extra = ["--wal", str(small_disk), "--wal-fsync", "always"]
    acknowledged = 0
    with LocalCluster(1, extra_args=extra, workdir=tmp_path / "run") as cluster:
        with PSClient(cluster.endpoints, FAST) as client:
            client.create_table(SPEC)
            with pytest.raises(PSClientError) as refused:
                for _ in range(200):  # 16 KiB of gradients per push: the 1 MiB disk fills
                    client.push(SPEC.name, ids, torch.ones(64, SPEC.dim))
                    acknowledged += 1
            assert 10 < acknowledged < 200
            assert "No space left on device" in refused.value.details
            assert (
                serving_status(cluster.endpoints[0]) == health_pb2.HealthCheckResponse.NOT_SERVING
            )
        cluster.kill_shard(0)
        cluster.restart_shard(0)  # on the same full disk: recovery needs no room
        with PSClient(cluster.endpoints) as client:
            rows, versions = client.pull_with_versions(SPEC.name, ids)
    assert versions.eq(acknowledged).all()
    expected = initial_rows(SPEC, ids.numpy()).double() - 0.5 * acknowledged
    np.testing.assert_allclose(rows.double().numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)
