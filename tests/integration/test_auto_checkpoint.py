"""Real shards that checkpoint themselves: the log stays bounded, a SIGKILL at any moment, also
inside an automatic checkpoint, loses no acknowledged push and applies none twice, and a full
checkpoint disk leaves the shard serving and unhealthy until it has room again."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.cluster import ClusterError, LocalCluster
from ember.ps_server.durability.checkpoint_format import MANIFEST
from ember.ps_server.durability.retention import TRASH_PREFIX
from ember.ps_server.errors import PSClientError
from ember.ps_server.shard.initializers import initial_rows
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec
from grpc_health.v1 import health_pb2

from tests.support.health import await_status
from tests.support.pushers import PATIENT, StepPusher, expected_rows
from tests.support.tmpfs import mounted_tmpfs

CRASHING_SHARD = Path(__file__).resolve().parents[1] / "support" / "crashing_checkpoint_shard.py"
SPEC = TableSpec("auto", dim=8, optimizer=OptimizerSpec(OptimizerKind.ADAM, lr=0.05))
IDS = [np.arange(0, 64, dtype=np.int64), np.arange(10_000, 10_064, dtype=np.int64)]
MAX_MESSAGE = 65_536
LIMIT = 100_000  # bytes of log: a push here is a record of over 2.5 kB
STEPS = 150


def _flags(tmp_path: Path, *more: str) -> list[str]:
    return [
        "--wal", str(tmp_path / "wal"), "--wal-fsync", "always",
        "--checkpoint-root", str(tmp_path / "ckpt"), "--max-message-bytes", str(MAX_MESSAGE),
        "--wal-max-bytes", str(LIMIT), "--checkpoint-keep", "2", *more,
    ]  # fmt: skip


def _log_bytes(tmp_path: Path) -> int:
    return sum(path.stat().st_size for path in (tmp_path / "wal").glob("*.wal"))


def _auto_dir(tmp_path: Path) -> Path:
    return tmp_path / "ckpt" / "auto" / "shard-0-of-1"


def _checkpoints(tmp_path: Path) -> list[Path]:
    return sorted(_auto_dir(tmp_path).glob("ckpt-*"))


def _finished_checkpoints(tmp_path: Path) -> list[Path]:
    return [checkpoint for checkpoint in _checkpoints(tmp_path) if (checkpoint / MANIFEST).exists()]


def _push_all(endpoints: list[str]) -> list[StepPusher]:
    pushers = [StepPusher(endpoints, SPEC, ids, seed, STEPS) for seed, ids in enumerate(IDS)]
    for pusher in pushers:
        pusher.start()
    return pushers


def _assert_every_push_applied_once(client: PSClient, pushers: list[StepPusher]) -> None:
    for pusher in pushers:
        pusher.join(180)
        assert not pusher.is_alive() and pusher.error is None, pusher.error
    for seed, ids in enumerate(IDS):
        rows, versions = client.pull_with_versions(SPEC.name, torch.from_numpy(ids))
        assert versions.eq(STEPS).all(), versions
        np.testing.assert_allclose(
            rows.double().numpy(), expected_rows(SPEC, ids, seed, STEPS), rtol=1e-4, atol=1e-5
        )


def test_the_log_stays_bounded_and_a_sigkill_loses_no_acknowledged_push(tmp_path):
    with (
        LocalCluster(1, extra_args=_flags(tmp_path), workdir=tmp_path / "run") as cluster,
        PSClient(cluster.endpoints, PATIENT) as client,
    ):
        client.create_table(SPEC)
        pushers = _push_all(cluster.endpoints)
        assert pushers[0].reached(STEPS // 2).wait(120)
        cluster.kill_shard(0)
        cluster.restart_shard(0)  # restores its newest automatic checkpoint, replays the rest
        _assert_every_push_applied_once(client, pushers)
        pushed = len(IDS) * STEPS * len(IDS[0]) * (8 + 4 * SPEC.dim)  # ids and gradients
        assert pushed > 5 * LIMIT  # without automatic checkpoints the log would hold it all
        assert _log_bytes(tmp_path) <= 2 * LIMIT
        kept = _checkpoints(tmp_path)
        assert int(kept[-1].name[5:]) >= 5, "fewer automatic checkpoints than the log implies"
        assert 2 <= len(kept) <= 8  # the newest two and the chain they need
        assert _log_base(tmp_path) == kept[-1].resolve()
        cluster_root = tmp_path / "ckpt" / "cluster"
        client.checkpoint(cluster_root)  # a whole-cluster checkpoint: the log continues it
        assert _log_base(tmp_path).parent == cluster_root.resolve()
        for _ in range(500):  # until the shard checkpoints itself again
            client.push(SPEC.name, torch.from_numpy(IDS[0]), torch.zeros(len(IDS[0]), SPEC.dim))
            if _log_base(tmp_path).parent == _auto_dir(tmp_path).resolve():
                break
        else:
            raise AssertionError("no automatic checkpoint after the cluster's")
        with pytest.raises(PSClientError, match="take a full one"):  # its base is not the last
            client.checkpoint(cluster_root, incremental=True)


def test_an_empty_log_beside_the_shards_own_checkpoints_is_refused(tmp_path):
    """An unmounted or mistyped --wal directory must not start the shard from nothing: its
    automatic checkpoints would then prune the real ones."""
    ids = torch.from_numpy(IDS[0])
    with (
        LocalCluster(1, extra_args=_flags(tmp_path), workdir=tmp_path / "run") as cluster,
        PSClient(cluster.endpoints) as client,
    ):
        client.create_table(SPEC)
        for _ in range(500):  # until the shard has finished a checkpoint of itself
            client.push(SPEC.name, ids, torch.ones(len(ids), SPEC.dim))
            if _finished_checkpoints(tmp_path):
                break
    kept = _finished_checkpoints(tmp_path)
    assert kept
    (tmp_path / "wal").rename(tmp_path / "wal-elsewhere")
    with (
        pytest.raises(ClusterError, match="log in .* is empty, but this shard checkpointed"),
        LocalCluster(1, extra_args=_flags(tmp_path), workdir=tmp_path / "run"),
    ):
        pass
    assert _finished_checkpoints(tmp_path) == kept
    restore = ["--restore", str(kept[-1])]
    with (
        LocalCluster(1, extra_args=_flags(tmp_path, *restore), workdir=tmp_path / "run") as cluster,
        PSClient(cluster.endpoints) as client,
    ):  # as the error says, go on from the newest one: its rows, not fresh ones
        assert client.pull_with_versions(SPEC.name, ids)[1].gt(0).all()


def _log_base(tmp_path: Path) -> Path:
    return Path(json.loads((tmp_path / "wal" / "shard-0-of-1.base.json").read_text())["checkpoint"])


@pytest.mark.parametrize("phase", ["files", "manifest", "base", "prune"])
def test_a_sigkill_in_any_phase_of_an_automatic_checkpoint_loses_nothing(tmp_path, phase):
    armed = tmp_path / "armed"
    armed.touch()
    command = [sys.executable, str(CRASHING_SHARD), str(armed), phase]
    with (
        LocalCluster(
            1, extra_args=_flags(tmp_path), workdir=tmp_path / "run", server_command=command
        ) as cluster,
        PSClient(cluster.endpoints, PATIENT) as client,
    ):
        client.create_table(SPEC)
        pushers = _push_all(cluster.endpoints)
        assert cluster.processes[0].wait(120) == -9  # it killed itself in that phase
        assert not armed.exists()
        newest = _checkpoints(tmp_path)[-1]
        base_file = tmp_path / "wal" / "shard-0-of-1.base.json"
        base = json.loads(base_file.read_text()) if base_file.exists() else {"segment": 1}
        base_checkpoint = Path(base.get("checkpoint", "none"))
        segments = sorted((tmp_path / "wal").glob("*.wal"))
        first_kept = f"shard-0-of-1.{base['segment']:08d}.wal"
        evidence = {
            "files": any(newest.glob("*.rows")) and not (newest / MANIFEST).exists(),
            "manifest": (newest / MANIFEST).exists() and base_checkpoint != newest,
            "base": base_checkpoint == newest and segments[0].name < first_kept,
            "prune": any(_auto_dir(tmp_path).glob(TRASH_PREFIX + "*")),
        }
        assert evidence[phase], (phase, newest, base, segments)
        cluster.restart_shard(0)
        _assert_every_push_applied_once(client, pushers)
        assert not any(_auto_dir(tmp_path).glob(TRASH_PREFIX + "*"))  # later prunes finished it


@pytest.fixture
def growable_disk(tmp_path):
    """A tmpfs of 512 KiB, and a function that grows it to 64 MiB."""
    with mounted_tmpfs(tmp_path / "disk", "512k") as resize:
        yield tmp_path / "disk", lambda: resize("64m")


def test_a_full_checkpoint_disk_leaves_the_shard_serving_and_unhealthy(tmp_path, growable_disk):
    disk, grow = growable_disk
    spec = TableSpec("wide", dim=64, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=0.5))
    limit = 1 << 20
    flags = [
        "--wal", str(tmp_path / "wal"), "--wal-fsync", "always", "--checkpoint-root", str(disk),
        "--max-message-bytes", str(limit // 2), "--wal-max-bytes", str(limit),
    ]  # fmt: skip
    batches = [torch.arange(k * 1024, (k + 1) * 1024) for k in range(8)]  # 2 MiB of rows
    with (
        LocalCluster(1, extra_args=flags, workdir=tmp_path / "run") as cluster,
        PSClient(cluster.endpoints) as client,
    ):
        endpoint = cluster.endpoints[0]
        client.create_table(spec)
        for ids in batches:  # 256 kB a push: past the limit, the checkpoint does not fit
            client.push(spec.name, ids, torch.ones(len(ids), spec.dim))
        await_status(endpoint, health_pb2.HealthCheckResponse.NOT_SERVING, 60)
        for ids in batches:  # still acknowledged: the log on its own disk keeps them
            client.push(spec.name, ids, torch.ones(len(ids), spec.dim))
        grow()
        await_status(endpoint, health_pb2.HealthCheckResponse.SERVING, 120)
        assert any((path / MANIFEST).exists() for path in (disk / "auto").glob("*/ckpt-*"))
        cluster.kill_shard(0)
        cluster.restart_shard(0)
        for ids in batches:
            rows, versions = client.pull_with_versions(spec.name, ids)
            assert versions.eq(2).all()
            expected = initial_rows(spec, ids.numpy()).double() - 2 * 0.5
            np.testing.assert_allclose(rows.double(), expected, rtol=1e-6, atol=1e-6)
