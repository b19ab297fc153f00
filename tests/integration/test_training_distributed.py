"""Two trainer ranks under torchrun against real shards."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from ember.ps_server.client import PSClient
from ember.ps_server.cluster import LocalCluster
from ember.trainer.models.dlrm import DLRM
from ember.trainer.train import TrainConfig, synthetic_data, table_specs

from tests.support.reference_dlrm import ReferenceEmbeddings, sparse_optimizer

STEPS, BATCH, CARDINALITY = 15, 64, 300


@pytest.mark.parametrize("mode", ["none", "replicated"])
def test_two_rank_sgd_equals_a_single_process_run_on_the_union_of_batches(
    cluster, tmp_path, table_name, mode
):
    report_path = tmp_path / "report.json"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "-m", "ember.cli.main", "train", "--endpoints", ",".join(cluster.endpoints),
        "--steps", str(STEPS), "--batch-size", str(BATCH), "--max-cardinality", str(CARDINALITY),
        "--optimizer", "sgd", "--sparse-lr", "0.5", "--dense-lr", "0.05", "--dim", "8",
        "--eval-batches", "1", "--no-progress", "--report", str(report_path),
        "--table-prefix", table_name, "--cache", mode, "--cache-mb", "0.05",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(command, check=True, timeout=300, env=env, capture_output=True)
    report = json.loads(report_path.read_text())
    ps_losses = report["train_losses"]
    if mode == "replicated":
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
    assert (
        stale["bytes_pulled_per_sample"] < 0.8 * sync["bytes_pulled_per_sample"]
    )  # staleness saved traffic
    assert stale["train_losses"] != sync["train_losses"]  # the runs really differ
    assert abs(stale["heldout_auc"] - sync["heldout_auc"]) <= 0.005
