"""benchmarks/gpu_check.py runs: on a GPU it checks the CUDA ops, elsewhere its dry mode says so."""

import json
import subprocess
import sys
from pathlib import Path

import torch

from tests.support.native import require_native

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def test_gpu_check_runs_and_every_op_matches_its_reference(tmp_path):
    require_native()  # the script compares the native ops with their references
    report_path = tmp_path / "gpu.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--ids", "20000", "--out", str(report_path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(report_path.read_text())
    assert report["checks"] and all(report["checks"].values())
    assert {
        "unique_inverse", "hash_map", "gather_rows", "scatter_add_rows", "device_staging",
    } <= set(report["checks"])  # fmt: skip
    training = report["training"]
    assert set(training["runs"]) == {
        "static cache", "serial, no cache", "pipeline s=0", "pipeline s=1, hot replica",
    }  # fmt: skip
    for run in training["runs"].values():
        assert run["ok"] and run["steps"] > 0
        assert run["device"] == ("cuda:0" if torch.cuda.is_available() else "cpu")
    assert training["pipeline_s0_exact"]
    if torch.cuda.is_available():
        assert not report["dry_mode"] and report["bandwidth"]["copy_GBps"] > 0
    else:
        assert (
            report["dry_mode"] and "no GPU found" in result.stdout and "DRY MODE" in result.stdout
        )
        # The CPU runs sum in the same order: the same losses, bit for bit.
        assert training["pipeline_s0_max_relative_difference"] == 0.0
