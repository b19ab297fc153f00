"""SASRec through the PS under torchrun with the balancer, on an interactions file, and
``ember plan`` feeding ``ember train --plan``."""

import json
import os
import subprocess
import sys

import numpy as np

EMBER = [sys.executable, "-m", "ember.cli.main"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _sasrec(cluster, table_name, *extra):
    return [
        "train", "--model", "sasrec", "--endpoints", ",".join(cluster.endpoints),
        "--steps", "6", "--batch-size", "32", "--dim", "16", "--negatives", "8",
        "--eval-batches", "1", "--no-progress", "--table-prefix", table_name, *extra,
    ]  # fmt: skip


def test_two_ranks_balance_their_share_and_report_stragglers(cluster, tmp_path, table_name):
    report_path = tmp_path / "report.json"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "-m", "ember.cli.main", *_sasrec(cluster, table_name, "--report", str(report_path)),
    ]  # fmt: skip
    subprocess.run(command, check=True, timeout=300, env=ENV, capture_output=True)
    report = json.loads(report_path.read_text())
    assert report["steps"] == 6 and report["balancer"] == "cost"
    # The dense gradients are summed by hand: both ranks' parameters stay identical.
    assert len(set(report["dense_checksums"])) == 1
    assert len(report["compute_s_per_rank"]) == 2 and min(report["compute_s_per_rank"]) > 0
    # The cost model's split of each global batch: near-equal predicted cost per rank.
    assert 1.0 <= report["predicted_straggler_ratio"] < 1.2
    assert len(report["train_losses"]) == 6 and np.isfinite(report["train_losses"]).all()
    assert 0.0 <= report["heldout_hr10"] <= 1.0 and report["heldout_samples"] == 32


def test_interactions_file_trains_with_its_rules_counted(cluster, tmp_path, table_name):
    lines = ["user,item,timestamp", "1,5,10", "1,6,11", "bad line", "2,7,3"]
    lines += [f"{3 + u},{(u + t) % 40},{t}" for u in range(60) for t in range(3 + u % 30)]
    path = tmp_path / "interactions.csv"
    path.write_text("\n".join(lines) + "\n")
    report_path = tmp_path / "report.json"
    command = [
        *EMBER, *_sasrec(cluster, table_name, "--interactions", str(path), "--max-len", "10",
                         "--report", str(report_path)),
    ]  # fmt: skip
    subprocess.run(command, check=True, timeout=300, env=ENV, capture_output=True)
    report = json.loads(report_path.read_text())
    assert report["dropped_empty_histories"] == 1  # user 2: one interaction, nothing to predict
    assert report["truncated_histories"] > 0  # histories past --max-len keep their last 10
    assert report["steps"] >= 1


def test_plan_file_applies_to_training(cluster, tmp_path, table_name):
    figures = tmp_path / "figures.json"
    figures.write_text(
        json.dumps({
            "figures": {
                "cpu_exact": {"base_s": 0.02, "per_cold_row_s": 2e-6},
                "cpu_stale": {"base_s": 0.02, "per_cold_row_s": 1e-6},
            }
        })
    )  # fmt: skip
    workload = [
        "--batch-size", "64", "--max-cardinality", "500", "--dim", "8", "--cache-mb", "0.2",
        "--staleness", "1", "--profile-batches", "4", "--table-prefix", table_name,
        "--steps", "4",
    ]  # fmt: skip
    plan_path = tmp_path / "plan.json"
    printed = subprocess.run(
        [*EMBER, "plan", *workload, "--figures", str(figures), "--bandwidth-mbit", "5",
         "--out", str(plan_path)],
        check=True, timeout=120, env=ENV, capture_output=True, text=True,
    ).stdout  # fmt: skip
    plan = json.loads(plan_path.read_text())
    assert "<- plan" in printed and plan["predicted_gain"] > 1
    assert plan["choice"]["hot_rows"] > 0 and plan["workload"]["batch_size"] == 64
    report_path = tmp_path / "report.json"
    subprocess.run(
        [*EMBER, "train", *workload, "--endpoints", ",".join(cluster.endpoints),
         "--eval-batches", "1", "--no-progress", "--plan", str(plan_path),
         "--report", str(report_path)],
        check=True, timeout=300, env=ENV, capture_output=True,
    )  # fmt: skip
    config = json.loads(report_path.read_text())["config"]
    assert config["cache"] == "replicated"
    assert config["staleness"] == plan["choice"]["staleness"]
    assert config["cache_mb"] == plan["choice"]["cache_mb"]
