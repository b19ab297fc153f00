"""Prometheus endpoints of a real shard and a real trainer: the named series move."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.client.step_client import StepClient
from ember.ps_server.client.step_job import StepJob
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.wire.messages import encode_ids, pb, pb_grpc
from ember.ps_server.wire.table_spec import TableSpec
from prometheus_client.parser import text_string_to_metric_families

from ember.deploy.redis_process import free_port

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "docker" / "monitoring" / "grafana" / "dashboards" / "ember-training.json"
EMBER = [sys.executable, "-m", "ember.cli.main"]


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample at ``http://127.0.0.1:port/metrics`` by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture(scope="module")
def metered(tmp_path_factory) -> LocalCluster:
    wal = tmp_path_factory.mktemp("wal")
    args = ["--metrics-port", "0", "--wal", str(wal), "--wal-fsync", "always"]
    with LocalCluster(1, args) as cluster:
        yield cluster


def test_a_shards_metrics_count_calls_errors_rows_dedup_fsyncs_and_clocks(metered, table_name):
    port = metered.ready_info[0]["metrics_port"]
    before = scrape(port)
    ids = np.array([1, 2, 3], dtype=np.int64)
    with PSClient(metered.endpoints) as client:
        client.create_table(TableSpec(table_name, dim=4))
        with grpc.insecure_channel(metered.endpoints[0]) as channel:
            stub = pb_grpc.ParameterServerStub(channel)
            push = pb.PushRequest(
                table=table_name, ids=encode_ids(ids), grads=np.ones((3, 4), np.float32).tobytes(),
                request_id="push-1",
            )  # fmt: skip
            stub.Push(push, timeout=10)
            stub.Push(push, timeout=10)  # a retry: deduplicated
            with pytest.raises(grpc.RpcError):
                stub.Pull(pb.PullRequest(table="no-such-table", ids=encode_ids(ids)), timeout=10)
            for name in ("Nope1", "Nope2"):  # names a caller makes up
                with pytest.raises(grpc.RpcError):
                    channel.unary_unary(f"/ember.v1.ParameterServer/{name}")(b"", timeout=10)
        client.pull(table_name, torch.from_numpy(ids))
        job = f"job-{uuid.uuid4().hex}"
        steps = StepClient(client, StepJob(job, wait_s=30))
        for clock in range(3):
            steps.update({table_name: (torch.tensor([1, 2]), torch.ones(2, 4))}, clock=clock)
    after = scrape(port)

    def moved(name: str, **labels) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    grpc_push = {"transport": "grpc", "method": "Push"}
    assert moved("ember_shard_calls_total", **grpc_push) == 2
    assert moved("ember_shard_call_seconds_count", **grpc_push) == 2
    assert moved("ember_shard_call_seconds_sum", **grpc_push) > 0
    assert moved("ember_shard_calls_total", transport="grpc", method="Update") == 3
    assert (
        moved("ember_shard_call_errors_total", transport="grpc", method="Pull", code="NOT_FOUND")
        == 1
    )
    assert moved("ember_shard_call_errors_total", **grpc_push, code="NOT_FOUND") == 0
    # Method names a caller makes up create no series (unbounded labels would grow forever).
    assert not [key for key in after if "Nope" in str(key)]
    assert value(after, "ember_shard_push_requests_total", table=table_name) == 2 + 3
    assert value(after, "ember_shard_duplicate_pushes_total", table=table_name) == 1
    assert value(after, "ember_shard_rows_pushed_total", table=table_name) == 3 + 3 * 2
    assert value(after, "ember_shard_rows_pulled_total", table=table_name) >= 3
    assert value(after, "ember_shard_table_rows", table=table_name) == 3
    assert value(after, "ember_shard_table_bytes", table=table_name) > 0
    assert moved("ember_shard_wal_fsync_seconds_count") >= 5  # always: one per write at least
    assert value(after, "ember_shard_watermark", job=job) == 2
    assert value(after, "ember_shard_clock_lag", job=job) == 0


def test_a_taken_metrics_port_stops_the_shard_with_a_clear_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [*EMBER, "ps", "--metrics-port", str(port)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert result.returncode != 0
    assert f"cannot serve metrics on 127.0.0.1:{port}" in result.stderr
    assert "is the port taken?" in result.stderr


def test_a_trainers_metrics_move_while_it_trains_and_the_dashboard_names_real_series(metered):
    port = free_port()
    command = [
        *EMBER, "train", "--endpoints", metered.endpoints[0], "--steps", "400",
        "--batch-size", "64", "--eval-batches", "1", "--max-cardinality", "2000",
        "--table-prefix", f"m{uuid.uuid4().hex[:8]}", "--no-progress", "--metrics-port", str(port),
        "--cache", "replicated", "--staleness", "1", "--torch-threads", "1",
    ]  # fmt: skip
    trainer = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        seen = _scrape_while_training(port, trainer)
    finally:
        trainer.kill() if trainer.poll() is None else None
        trainer.wait()
    first, later = seen[0], seen[-1]
    assert value(later, "ember_trainer_steps_total", rank="0") > value(
        first, "ember_trainer_steps_total", rank="0"
    )
    assert value(later, "ember_trainer_samples_per_second", rank="0") > 0
    assert value(later, "ember_trainer_hot_hit_rate", rank="0") > 0
    assert value(later, "ember_trainer_bytes_per_sample", rank="0", category="hot_allreduce") == 0
    assert value(later, "ember_trainer_bytes_per_sample", rank="0", category="control") > 0
    assert value(later, "ember_trainer_ps_wait_seconds", rank="0") > 0
    assert value(later, "ember_trainer_row_clock_lag", rank="0") in (0, 1)  # staleness 1
    # Every series the Grafana dashboard plots exists on a shard or a trainer.
    names = {name for name, _ in later} | {
        name for name, _ in scrape(metered.ready_info[0]["metrics_port"])
    }
    wanted = set(re.findall(r"ember_[a-z_]+", DASHBOARD.read_text()))
    assert wanted and wanted <= names, wanted - names


def _scrape_while_training(port: int, trainer: subprocess.Popen) -> list[dict]:
    """Scrapes until two scrapes saw different step counts, or the trainer ended."""
    seen: list[dict] = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and trainer.poll() is None:
        try:
            samples = scrape(port)
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.2)  # not serving yet: the trainer is starting
            continue
        if ("ember_trainer_steps_total", (("rank", "0"),)) in samples:
            seen.append(samples)
        if len({value(s, "ember_trainer_steps_total", rank="0") for s in seen}) >= 2:
            return seen
        time.sleep(0.2)
    pytest.fail(
        f"no two scrapes saw the trainer move: {json.dumps(len(seen))} scrapes; "
        f"exit {trainer.poll()}: {trainer.stderr.read() if trainer.poll() is not None else ''}"
    )
