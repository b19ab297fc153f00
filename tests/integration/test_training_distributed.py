"""Two trainer ranks under torchrun against real shards."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.cluster import LocalCluster
from ember.trainer.config import TrainConfig
from ember.trainer.models.dlrm import DLRM
from ember.trainer.train import synthetic_data, table_specs

from ember.deploy.topology import train_argv
from tests.support.criteo_file import write_criteo_file
from tests.support.reference_dlrm import ReferenceEmbeddings, sparse_optimizer
from tests.support.union_reference import pretrained_tables, union_reference

STEPS, BATCH, CARDINALITY = 15, 64, 300


@pytest.mark.parametrize("mode", ["none", "replicated", "replicated-flushing"])
def test_two_rank_sgd_equals_a_single_process_run_on_the_union_of_batches(
    cluster, tmp_path, table_name, mode
):
    """``replicated-flushing`` writes the replicas back every 4 steps mid-run too."""
    report_path = tmp_path / "report.json"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "-m", "ember.cli.main", "train", "--endpoints", ",".join(cluster.endpoints),
        "--steps", str(STEPS), "--batch-size", str(BATCH), "--max-cardinality", str(CARDINALITY),
        "--optimizer", "sgd", "--sparse-lr", "0.5", "--dense-lr", "0.05", "--dim", "8",
        "--eval-batches", "1", "--no-progress", "--report", str(report_path),
        "--table-prefix", table_name, "--cache", mode.split("-")[0], "--cache-mb", "0.05",
        "--flush-every", "4" if mode.endswith("flushing") else "0",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(command, check=True, timeout=300, env=env, capture_output=True)
    report = json.loads(report_path.read_text())
    ps_losses = report["train_losses"]
    if mode.startswith("replicated"):
        assert 0.2 < report["cache_hit_rate"] < 1.0  # hot rows served from the replicas

    config = TrainConfig(
        endpoints=("unused:0",), steps=STEPS, batch_size=BATCH, max_cardinality=CARDINALITY,
        optimizer="sgd", sparse_lr=0.5, dense_lr=0.05, dim=8, table_prefix=table_name,
    )  # fmt: skip
    data = synthetic_data(config)
    specs = table_specs(config, data.num_features)
    torch.manual_seed(config.seed)
    model = DLRM(13, data.num_features, config.dim)
    tables = ReferenceEmbeddings(specs, data.config.cardinalities)
    dense_opt = torch.optim.Adagrad(model.parameters(), lr=config.dense_lr)
    sparse_opt = sparse_optimizer(specs[0], tables.parameters())
    reference_losses = []
    for step in range(STEPS):
        parts = [data.batch(BATCH, step, "train", part=rank) for rank in (0, 1)]
        dense = torch.cat([p.dense for p in parts])
        labels = torch.cat([p.labels for p in parts])
        embedded = torch.cat([tables(p.sparse) for p in parts])
        dense_opt.zero_grad()
        sparse_opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, embedded), labels)
        loss.backward()
        dense_opt.step()
        sparse_opt.step()
        reference_losses.append(loss.item())
    np.testing.assert_allclose(ps_losses, reference_losses, rtol=1e-4)
    with PSClient(cluster.endpoints) as client:  # hot rows were written back at the end
        for spec, bag in zip(specs, tables.bags):
            rows = client.pull(spec.name, torch.arange(bag.num_embeddings))
            torch.testing.assert_close(rows, bag.weight.detach(), rtol=1e-4, atol=1e-5)


def _train_two_ranks(tmp_path, name: str, extra: list[str]) -> dict:
    report_path = tmp_path / f"{name}.json"
    with LocalCluster(2) as fresh:  # same table names and seeds: the runs differ only by the flags
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
            "-m", "ember.cli.main", "train", "--endpoints", ",".join(fresh.endpoints),
            "--steps", "100", "--batch-size", "256", "--max-cardinality", "2000", "--eval-batches", "16",
            "--sparse-lr", "0.02", "--dense-lr", "0.02",
            "--cache", "static", "--cache-mb", "1", "--no-progress", "--report", str(report_path), *extra,
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run(command, check=True, timeout=300, env=env, capture_output=True)
    return json.loads(report_path.read_text())


def test_bounded_staleness_keeps_auc_within_half_a_point_of_sync(tmp_path):
    sync = _train_two_ranks(tmp_path, "sync", ["--pull-bound", "0", "--push-bound", "0"])
    stale = _train_two_ranks(tmp_path, "stale", ["--pull-bound", "2", "--push-bound", "2"])
    assert stale["cache_hit_rate"] > 0.5

    def pulled(report):
        return report["bytes_pulled_per_sample"] + report["bytes_control_per_sample"]

    assert pulled(stale) < 0.8 * pulled(sync)  # staleness saved traffic
    assert stale["train_losses"] != sync["train_losses"]  # the runs really differ
    assert abs(stale["heldout_auc"] - sync["heldout_auc"]) <= 0.005


@pytest.mark.parametrize(
    ("cache", "optimizer"),
    [("none", "adagrad"), ("none", "adam"), ("replicated", "adam")],
)
def test_two_ranks_with_staleness_0_equal_one_process_on_the_union_for_every_optimizer(
    cluster, tmp_path, table_name, cache, optimizer
):
    """Earlier training left each row with optimizer state and a version. Through the step
    pipeline (cache none: every row cold) the shards sum both ranks' gradients of a step into
    one optimizer step per row; with every row hot (12 ids per table, all profiled) the
    replicas continue from the rows' state (Adam's step is the version) and hand back versions
    that count the steps taken. Either way: one process on the union of the batches."""
    config = TrainConfig(
        endpoints=tuple(cluster.endpoints), steps=8, batch_size=64, max_cardinality=12,
        optimizer=optimizer, sparse_lr=0.05, dense_lr=0.05, dim=8, table_prefix=table_name,
        cache=cache, cache_mb=1.0, profile_batches=30,
    )  # fmt: skip
    data = synthetic_data(config)
    specs = table_specs(config, data.num_features)
    sizes = data.config.cardinalities
    with PSClient(cluster.endpoints) as client:
        start = pretrained_tables(client, specs, sizes)
    report_path = tmp_path / "report.json"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "-m", "ember.cli.main", "train", *train_argv(config), "--no-progress",
        "--report", str(report_path), "--device", "cpu", "--eval-batches", "1",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(command, check=True, timeout=300, env=env, capture_output=True)
    report = json.loads(report_path.read_text())
    assert report["steps"] == config.steps and report["data_path"] == "pipeline"
    assert report["cache_hit_rate"] == (1.0 if cache == "replicated" else 0.0)
    assert report["max_clock_lag"] == 0
    losses, after = union_reference(config, data, specs, start)
    expected = after[-1]
    np.testing.assert_allclose(report["train_losses"], losses, rtol=1e-4)
    with PSClient(cluster.endpoints) as client:
        for feature, (spec, size) in enumerate(zip(specs, sizes)):
            rows, moments, held = client.pull_with_state(spec.name, torch.arange(size))
            weights, state, versions = expected[feature]
            assert torch.equal(held, versions), spec.name
            assert (held > start[feature][2]).any()  # the run did step these rows
            torch.testing.assert_close(rows, weights, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(moments, state, rtol=1e-4, atol=1e-6)


def test_two_ranks_on_a_criteo_file_profile_and_evaluate_on_it_and_stop_together(
    cluster, tmp_path, table_name
):
    """17 training batches for 2 ranks: rank 0's part of the file has one more, and both
    must stop after 8 steps (a rank left alone would hang in an all-reduce). The hot set
    comes from the file (its ids are a few hashed values, none of the synthetic ones) and
    evaluation reads the file's held-out lines."""
    path = tmp_path / "day.tsv"
    valid = write_criteo_file(path, 310)
    train_lines = sum(valid[n] for n in range(310) if n % 10 != 9)
    heldout_lines = sum(valid[n] for n in range(310) if n % 10 == 9)
    assert -(-train_lines // 16) == 17
    report_path = tmp_path / "report.json"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "-m", "ember.cli.main", "train", "--endpoints", ",".join(cluster.endpoints),
        "--criteo", str(path), "--heldout-every", "10", "--batch-size", "16", "--steps", "1000",
        "--eval-batches", "50", "--max-cardinality", "100000", "--dim", "4",
        "--cache", "static", "--cache-mb", "0.05", "--table-prefix", table_name,
        "--no-progress", "--report", str(report_path),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(command, check=True, timeout=300, env=env, capture_output=True)
    report = json.loads(report_path.read_text())
    assert report["steps"] == 8 == len(report["train_losses"])
    assert report["heldout_samples"] == heldout_lines
    assert 0.0 <= report["heldout_auc"] <= 1.0
    assert 0 < report["malformed_lines"] <= sum(not v for v in valid)
    assert report["cache_hit_rate"] > 0.8  # profiled on the file's own ids
