"""python -m benchmarks runs a benchmark and writes the results and the table."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_one_benchmark_runs_through_the_suite(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", "bench_kernels", "--no-readme",
         "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    figures = results["benchmarks"]["bench_kernels"]["figures"]
    assert results["quick"] and figures[0]["target"] == ">= 1.5"
    assert "| bench_kernels | dedup + gather + scatter_add" in (tmp_path / "results.md").read_text()
