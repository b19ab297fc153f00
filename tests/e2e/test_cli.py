"""The ``ember`` console script as a user runs it."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.client.step_client import StepClient
from ember.ps_server.client.step_job import StepJob
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.durability.checkpoint_format import Manifest
from ember.ps_server.wire.table_spec import TableSpec

from tests.support.native import require_native
from tests.support.raw_frames import require_ucx

EMBER = [sys.executable, "-m", "ember.cli.main"]


def _wait_for(path: Path, process: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert process.poll() is None, process.stdout.read()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_cluster_up_serves_then_stops_cleanly(tmp_path, stop_signal):
    endpoints_file = tmp_path / "endpoints.json"
    process = subprocess.Popen(
        [*EMBER, "cluster", "up", "--shards", "3", "--endpoints-file", str(endpoints_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_for(endpoints_file, process)
        endpoints = json.loads(endpoints_file.read_text())["endpoints"]
        assert len(endpoints) == 3
        with PSClient(endpoints) as client:
            client.create_table(TableSpec("cli", dim=4))
            assert client.pull("cli", [1, 2, 3]).shape == (3, 4)
            assert [s.shard for s in client.stats()] == [0, 1, 2]
        process.send_signal(stop_signal)
        output, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, output
    assert "cluster stopped" in output
    assert not endpoints_file.exists()


def test_demo_trains_on_two_ranks_and_writes_the_report(tmp_path):
    report_path = tmp_path / "report.json"
    result = subprocess.run(
        [*EMBER, "demo", "--steps", "30", "--batch-size", "256", "--eval-batches", "4",
         "--max-cardinality", "5000", "--no-progress", "--report", str(report_path),
         "--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(report_path.read_text())
    assert report["world_size"] == 2 and report["steps"] == 30
    assert report["samples_per_s"] > 0
    # 16 MiB of hot rows hold most of 26 x 5,000 rows: cold pulls may be none at all
    assert report["bytes_pulled_per_sample"] >= 0 and report["bytes_replica_sync"] > 0
    assert report["data_path"] == "pipeline" and report["config"]["staleness"] <= 1
    assert report["cache_hit_rate"] > 0.3  # the demo replicates the profiled hot rows
    assert 0 <= report["max_clock_lag"] <= report["config"]["staleness"]
    assert report["bytes_hot_allreduce_per_sample"] > 0
    assert 0.55 < report["heldout_auc"] < 1.0  # the planted model is learnable
    assert report["compute_s"] + report["ps_wait_s"] == pytest.approx(report["wall_s"])
    assert 0 <= report["embedding_work_s"] <= report["compute_s"]
    assert report["config"]["batch_size"] == 256
    assert "held-out AUC" in result.stdout and "shards stopped cleanly" in result.stdout
    assert "exposed PS wait" in result.stdout and "embedding work on this rank" in result.stdout
    # The demo ends by naming its run report: the plots and the summary.
    assert f"run report: {tmp_path / 'run' / 'summary.md'}" in result.stdout
    assert len(list((tmp_path / "run").glob("*.png"))) == 5
    steps = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in steps] == list(range(1, 31))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["ps", "--shard", "3", "--num-shards", "2"], "shard must be in 0..1"),
        (["ps", "--port", "70000"], "port must be in 0..65535"),
        (["cluster", "up", "--shards", "0"], "--shards must be >= 1"),
        (["demo", "--batch-size", "0"], "batch_size must be >= 1"),
        (
            ["train", "--endpoints", "127.0.0.1:1", "--optimizer", "lion"],
            "--optimizer: invalid choice: 'lion'",
        ),
        (["train"], "give --endpoints or --endpoints-file"),
        (
            ["ps", "--ucx", "--tls-cert", "/c.pem", "--tls-key", "/k.pem"],
            "UCX data plane is not encrypted",
        ),
        (["cluster", "compose", "--config", "/no/such.toml", "--out", "/tmp"], "No such file"),
        (["checkpoint", "--dir", "/tmp/x"], "give --endpoints or --endpoints-file"),
        (["ps", "--restore", "/nonexistent/ckpt"], "no finished checkpoint"),
        (["ps", "--wal-fsync", "sometimes"], "invalid choice: 'sometimes'"),
        (
            ["ps", "--wal", "/tmp/w", "--wal-fsync-interval-s", "0"],
            "wal_fsync_interval_s must be > 0",
        ),
        (["ps", "--store", "tiered+redis://h:1/0"], "needs ?capacity=ROWS"),
    ],
)
def test_bad_flags_exit_with_a_clear_message(argv, message):
    result = subprocess.run(
        [*EMBER, *argv], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == (2 if "usage:" in result.stderr else 1)  # argparse's or ours
    assert message in result.stderr


def test_a_bad_exit_setting_is_refused_before_the_command_runs() -> None:
    env = {**os.environ, "EMBER_EXIT_TEARDOWN": "maybe"}
    result = subprocess.run(
        [*EMBER, "--help"], capture_output=True, text=True, timeout=60, check=False, env=env
    )
    assert (result.returncode, result.stdout) == (1, "")
    assert "EMBER_EXIT_TEARDOWN='maybe' is not a valid value" in result.stderr


def test_help_names_every_command_and_exits_0() -> None:
    result = subprocess.run(
        [*EMBER, "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert (result.returncode, result.stderr) == (0, "")
    commands = [
        "ps",
        "cluster",
        "train",
        "checkpoint",
        "demo",
        "doctor",
        "certs",
        "health",
        "report",
        "plan",
    ]
    listed = re.findall(r"^ {4}(\w+) ", result.stdout, flags=re.MULTILINE)
    assert listed == commands  # the whole text reached the pipe


def test_checkpoint_command_writes_a_checkpoint_and_refuses_a_baseless_incremental(tmp_path):
    with (
        LocalCluster(1, extra_args=["--checkpoint-root", str(tmp_path)]) as cluster,
        PSClient(cluster.endpoints) as client,
    ):
        client.create_table(TableSpec("t", dim=4))
        client.push("t", [1, 2, 3], torch.ones(3, 4))
        base = [*EMBER, "checkpoint", "--endpoints", cluster.endpoints[0]]
        refused = subprocess.run(
            [*base, "--dir", str(tmp_path / "none"), "--incremental"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert refused.returncode != 0 and "take a full one first" in refused.stderr
        done = subprocess.run(
            [*base, "--dir", str(tmp_path / "ckpt")],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        directory = tmp_path / "ckpt" / "ckpt-000001"
        assert f"checkpoint written: {directory}" in done.stdout
        manifest = Manifest.load(directory)
        assert [entry.rows for entry in manifest.files[0] if entry.table == "t"] == [3]


def test_checkpoint_command_names_a_silent_replica_job_and_releases_it_when_told(tmp_path):
    with (
        LocalCluster(1, extra_args=["--checkpoint-root", str(tmp_path)]) as cluster,
        PSClient(cluster.endpoints) as client,
    ):
        client.create_table(TableSpec("t", dim=4))
        steps = StepClient(client, StepJob("job-gone", replica=True))
        steps.update({"t": (torch.arange(3), torch.ones(3, 4))}, clock=0)  # then it died
        base = [*EMBER, "checkpoint", "--endpoints", cluster.endpoints[0], "--dir", str(tmp_path)]
        refused = subprocess.run(
            [*base, "--flush-wait-s", "0.5"], capture_output=True, text=True, timeout=120,
            check=False,
        )  # fmt: skip
        assert refused.returncode != 0
        assert "job-gone" in refused.stderr and "--release-job" in refused.stderr
        done = subprocess.run(
            [*base, "--flush-wait-s", "0.5", "--release-job", "job-gone"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "checkpoint written" in done.stdout


def test_train_over_ucx_reports_the_transport_that_carried_its_steps(tmp_path):
    require_ucx()
    report_path = tmp_path / "report.json"
    with LocalCluster(2, extra_args=["--ucx"]) as cluster:
        result = subprocess.run(
            [*EMBER, "train", "--endpoints", ",".join(cluster.endpoints), "--transport", "ucx",
             "--cache", "replicated", "--cache-mb", "0.05", "--staleness", "1", "--steps", "12",
             "--batch-size", "64", "--max-cardinality", "300", "--eval-batches", "1",
             "--no-progress", "--device", "cpu", "--report", str(report_path)],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["transport"] == "ucx" and report["steps"] == 12


def test_a_shard_asked_for_ucx_without_a_binding_says_what_to_install(tmp_path):
    for name in ("ucp", "ucxx"):  # shadow the installed bindings with ones that fail
        (tmp_path / f"{name}.py").write_text("raise ImportError('not here')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    result = subprocess.run(
        [*EMBER, "ps", "--ucx"], capture_output=True, text=True, timeout=120, check=False,
        env=env,
    )  # fmt: skip
    assert result.returncode != 0
    assert "pip install 'ember-ps[ucx]'" in result.stderr, result.stderr[-2000:]


def test_flags_can_come_from_the_environment(tmp_path):
    ready_file = tmp_path / "ready.json"
    result = subprocess.run(
        [*EMBER, "ps", "--ready-file", str(ready_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "EMBER_SHARD": "5", "EMBER_NUM_SHARDS": "2"},
    )
    assert result.returncode != 0 and "shard must be in 0..1, got 5" in result.stderr


@pytest.mark.parametrize("mode, backend", [("reference", "reference (torch)"), ("auto", "native")])
def test_doctor_reports_every_op_backend(mode, backend):
    from ember.kernels.loader import OPS

    if mode == "auto":
        require_native()
    result = subprocess.run(
        [*EMBER, "doctor"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "EMBER_KERNELS": mode},
    )
    assert result.returncode == 0, result.stderr
    width = max(map(len, OPS))  # one column for every op name
    for op in OPS:
        assert f"  {op:<{width}} CPU: {backend:<18} CUDA: " in result.stdout
    assert f"EMBER_KERNELS={mode}" in result.stdout
    assert any(line.startswith("CUDA: ") for line in result.stdout.splitlines())


@pytest.mark.parametrize(("mode", "status"), [("native", 1), ("auto", 0)])
def test_doctor_fails_when_the_required_native_ops_do_not_build(tmp_path, mode, status):
    """make test sets EMBER_KERNELS=native, so a broken build fails CI instead of silently
    testing the reference ops; users (auto) still get the fallback."""
    result = subprocess.run(
        [*EMBER, "doctor"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={
            **os.environ,
            "EMBER_KERNELS": mode,
            "EMBER_KERNELS_CACHE": str(tmp_path),  # nothing built yet
            "CXX": "/bin/false",  # a compiler that fails
        },
    )
    assert result.returncode == status, result.stderr
    assert "CPU: reference (torch)" in result.stdout
    required = "the native ops are required (EMBER_KERNELS=native) but missing"
    assert (required in result.stderr) == (mode == "native")
