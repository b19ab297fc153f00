"""One cluster file, two launchers: the compose file and `ember cluster up --config`."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ember.ps_server.shard.config import ShardConfig
from ember.trainer.telemetry import PLOTS

from ember.cli.main import build_parser
from ember.cli.train_cmd import config_from_args
from ember.deploy.cluster_file import load_cluster_file
from ember.deploy.compose import compose_document, rendered_files
from ember.deploy.local import LocalDeployment
from ember.deploy.topology import train_config, trainer_module_args
from ember.settings import settings_from_args
from tests.support.redis_server import require_redis_server

REPO = Path(__file__).resolve().parents[2]
CLUSTER_FILE = REPO / "docker" / "cluster.toml"
COMPOSE_FILE = REPO / "docker" / "compose.yaml"
EMBER = [sys.executable, "-m", "ember.cli.main"]
# What differs between the launchers: where things are, not what runs.
PLACED = (
    "shard",
    "num_shards",
    "host",
    "port",
    "store",
    "wal",
    "exit_on_fault",
    "checkpoint_root",
    "metrics_port",
    "metrics_host",
)


def _compose_config() -> dict:
    """The compose file as docker-compose itself resolves it (no daemon needed)."""
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose is not installed (scripts/setup-compose.sh installs it)")
    result = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE_FILE), "config"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_the_compose_files_are_the_cluster_files_output():
    files = rendered_files(load_cluster_file(CLUSTER_FILE), "docker/cluster.toml")
    assert set(files) == {"compose.yaml", "monitoring/prometheus.yml"}
    for name, text in files.items():
        assert (REPO / "docker" / name).read_text() == text, (
            "regenerate: ember cluster compose --config docker/cluster.toml --out docker"
        )


def test_compose_and_cluster_up_run_the_same_topology_from_the_same_file(tmp_path):
    spec = load_cluster_file(CLUSTER_FILE)
    services = _compose_config()["services"]
    expected = ["redis", "shard-0", "shard-1", "trainer"]
    assert list(compose_document(spec)["services"]) == [
        *expected,
        "prometheus",
        "grafana",
    ]
    assert set(services) == {*expected, "prometheus", "grafana"}
    assert services["prometheus"]["profiles"] == services["grafana"]["profiles"] == ["monitoring"]
    local = LocalDeployment(spec, tmp_path)
    local._placement = dataclasses.replace(local.placement, redis_address="127.0.0.1:6379")
    for k in range(spec.shards):
        command = services[f"shard-{k}"]["command"]
        local_command = ["ps", "--shard", str(k), "--num-shards", str(spec.shards)]
        local_command += local.shard_flags()
        in_container, on_this_host = (_shard_config(c) for c in (command, local_command))
        assert (in_container.shard, in_container.num_shards) == (k, spec.shards)
        assert _unplaced(in_container) == _unplaced(on_this_host) == _unplaced(spec.shard)
        assert in_container.store.startswith("tiered+redis://redis:6379/")
        assert on_this_host.store.startswith("tiered+redis://127.0.0.1:6379/")
        assert bool(in_container.wal) == bool(on_this_host.wal) == spec.wal
        # Compose's restart policy starts a shard that exits on a fault again; nothing
        # restarts one of `ember cluster up`, so there it stays up, refusing.
        assert in_container.exit_on_fault == spec.wal
        assert not on_this_host.exit_on_fault
        assert (in_container.metrics_port, on_this_host.metrics_port) == (9400, 0)
        assert (in_container.metrics_host, on_this_host.metrics_host) == ("0.0.0.0", "127.0.0.1")
        assert services[f"shard-{k}"]["depends_on"]["redis"]["condition"] == "service_healthy"
        probe = ["python", "-m", "ember.cli.health_cmd", "127.0.0.1:50051"]
        assert services[f"shard-{k}"]["healthcheck"]["test"][1:] == probe
        # The log and the checkpoints are on the volume, which outlives the container.
        assert "ember-durable:/var/lib/ember" in services[f"shard-{k}"]["volumes"][0]
        assert in_container.wal.startswith("/var/lib/ember/")
    trainer = services["trainer"]
    assert trainer["entrypoint"] == ["python"]
    local_endpoints = ["127.0.0.1:1", "127.0.0.1:2"]
    local_args = trainer_module_args(spec, local_endpoints, local.placement)
    configs = []
    for args in (trainer["command"], local_args):
        assert args[:4] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
        assert args[4:9] == ["-m", "ember.cli.main", "--log-level", "WARNING", "train"]
        parsed = build_parser().parse_args(args[6:])
        configs.append(config_from_args(parsed, parsed.endpoints.split(",")))
    in_container, on_this_host = configs
    assert in_container.endpoints == ("shard-0:50051", "shard-1:50051")
    assert on_this_host == train_config(spec, local_endpoints, local.placement)
    placed = ("endpoints", "run_dir", "metrics_port", "metrics_host")
    assert dataclasses.replace(in_container, **{f: getattr(on_this_host, f) for f in placed}) == (
        on_this_host
    )
    assert in_container.run_dir.startswith("/var/lib/ember/") and in_container.metrics_port
    assert {name for name, dep in trainer["depends_on"].items()
            if dep["condition"] == "service_healthy"} == {"shard-0", "shard-1"}  # fmt: skip


def _shard_config(command: list[str]) -> ShardConfig:
    return settings_from_args(ShardConfig, build_parser().parse_args(command))


def _unplaced(config: ShardConfig) -> ShardConfig:
    """``config`` without what placement and shard numbering set."""
    return dataclasses.replace(
        config, **{name: ShardConfig().__getattribute__(name) for name in PLACED}
    )


def test_cluster_up_with_redis_two_shards_and_two_ranks_trains_to_the_end(tmp_path):
    require_redis_server()
    config = tmp_path / "cluster.toml"
    text = CLUSTER_FILE.read_text().replace("steps = 60", "steps = 12")
    assert "steps = 12" in text
    config.write_text(text)
    workdir = tmp_path / "run"
    # Settings in the environment reach no process: the file alone configures them.
    stray = {"EMBER_WORKERS": "0", "EMBER_STORE": "redis://127.0.0.1:1/0", "EMBER_TRAIN_STEPS": "0"}
    result = subprocess.run(
        [*EMBER, "cluster", "up", "--config", str(config), "--workdir", str(workdir),
         "--endpoints-file", str(tmp_path / "endpoints.json")],
        capture_output=True, text=True, timeout=300, check=False, env={**os.environ, **stray},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "starting Redis, 2 shards" in result.stdout
    report = json.loads((workdir / "run" / "report.json").read_text())
    assert (report["world_size"], report["steps"]) == (2, 12)
    assert report["heldout_auc"] > 0.55  # 12 steps: above chance, not yet good
    # The shards logged their writes and kept rows in Redis's append-only file.
    assert any((workdir / "wal").iterdir())
    assert any((workdir / "redis").rglob("*.aof*"))
    assert not (tmp_path / "endpoints.json").exists()
    # The run directory and its report: the plots and the summary.
    assert "run report: " in result.stdout
    assert {p.name for p in (workdir / "run").glob("*.png")} == {f"{name}.png" for name in PLOTS}
    assert (workdir / "run" / "summary.md").read_text().startswith("# Ember training run")
