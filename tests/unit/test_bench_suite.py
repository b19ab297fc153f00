"""The benchmark suite's table, and the README's copy of it."""

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_suite", REPO / "benchmarks" / "__main__.py")
suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)


def test_the_readme_table_is_the_suites_output():
    results = json.loads(suite.RESULTS_JSON.read_text())
    table = suite.markdown_table(results)
    readme = (REPO / "README.md").read_text()
    assert suite.with_table(readme, table) == readme, "run python -m benchmarks to refresh it"
    assert suite.RESULTS_MD.read_text() == "# Benchmark results\n\n" + table
    assert set(results["benchmarks"]) == set(suite.SUITE)
    assert {"cpu", "cores", "memory", "commit"} <= set(results["machine"])


def test_the_table_names_missed_targets_and_failed_benchmarks():
    results = {
        "date": "2026-12-01 00:00 UTC", "quick": True,
        "machine": dict.fromkeys(("cpu", "cores", "memory", "os", "python", "torch", "commit"), "x"),
        "benchmarks": {
            "a": {"status": "ok", "figures": [
                {"name": "r", "value": 0.42, "target": ">= 0.8", "met": False},
                {"name": "s", "value": 1.5, "target": "", "met": None},
            ]},
            "b": {"status": "failed (exit 1)", "figures": []},
            "c": {"status": "ok", "figures": [], "rerun": "re-run alone at commit abc"},
        },
    }  # fmt: skip
    table = suite.markdown_table(results)
    assert "| a | r | 0.42 | >= 0.8 | **no** |" in table
    assert "| a | s | 1.5 |  |  |" in table
    assert "| b | failed (exit 1) |" in table
    assert "(quick sizes)" in table
    assert table.endswith("re-run alone since:\n\n* c: re-run alone at commit abc\n")
