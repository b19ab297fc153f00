"""The benchmark suite: ``python -m benchmarks [--quick]`` from the repository root.

Runs every benchmark as its own process (each starts its own shards and baselines),
collects their headline figures into ``benchmarks/results.json``, writes the table in
``benchmarks/results.md`` with the machine's details, and puts the same table into the
README between its ``bench-table`` markers. ``--quick`` runs small sizes (minutes, for a
check that everything runs; its ratios are noisier).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS_JSON = HERE / "results.json"
RESULTS_MD = HERE / "results.md"
README = REPO / "README.md"
START_MARK, END_MARK = "<!-- bench-table:start -->", "<!-- bench-table:end -->"

# Each benchmark with its full and quick arguments.
SUITE: dict[str, tuple[list[str], list[str]]] = {
    "bench_kernels": ([], ["--ids", "200000", "--table-rows", "1000000", "--repeats", "5"]),
    "bench_ps": (
        [], ["--sizes", "1024,16384", "--step-sizes", "16384", "--rounds", "3", "--budget-s", "0.2"]
    ),
    "bench_ucx": ([], ["--sizes", "1024,16384", "--rounds", "3", "--budget-s", "0.2"]),
    "bench_cold_tier": (
        [],
        ["--ids", "4096", "--rounds", "3", "--universe", "50000", "--batches", "20",
         "--wal-pushes", "10", "--tracked", "500000"],
    ),
    "bench_trainer": ([], ["--steps", "60", "--loopback-only", "--rounds", "1"]),
    "bench_wire_dtype": ([], ["--steps", "40", "--eval-batches", "4"]),
    "bench_plan": ([], ["--steps", "30", "--calibration-steps", "20", "--rates-mbit", "", "--repeats", "1"]),
    "bench_balance": ([], ["--steps", "30"]),
    "bench_scale": ([], ["--sizes", "100000,400000", "--wal-gb", "0.3"]),
}  # fmt: skip


def machine() -> dict[str, str]:
    """What the figures were measured on."""
    cpu = platform.processor() or platform.machine()
    memory = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        kib = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
        memory = f"{kib / 2**20:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    import torch

    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "memory": memory,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "commit": commit or "unknown",
    }


# A benchmark that runs longer than this has hung (the full trainer one takes ~10 minutes).
TIMEOUT_S = 3600


def _run_bounded(command: list[str]) -> int | str:
    """Run a benchmark; its exit status, or why it was stopped. Past :data:`TIMEOUT_S` it
    gets SIGINT (so it stops the shards it started) and SIGKILL a minute later."""
    process = subprocess.Popen(command, cwd=REPO, start_new_session=True)
    try:
        return process.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        return f"timed out after {TIMEOUT_S} s"


def run_suite(names: list[str], quick: bool, scratch: Path) -> dict:
    """Run ``names`` (their figures in ``scratch``); the results document."""
    results = {}
    for name in names:
        full, small = SUITE[name]
        out = scratch / f"{name}.json"
        command = [
            sys.executable,
            str(HERE / f"{name}.py"),
            *(small if quick else full),
            "--json",
            str(out),
        ]
        print(f"== {name} {' '.join(small if quick else full)}", flush=True)
        start = time.perf_counter()
        status = _run_bounded(command)
        seconds = time.perf_counter() - start
        if status == 0 and out.exists():
            figures = json.loads(out.read_text())["figures"]
            results[name] = {"status": "ok", "seconds": seconds, "figures": figures}
        else:
            failed = status if isinstance(status, str) else f"failed (exit {status})"
            results[name] = {"status": failed, "seconds": seconds, "figures": []}
        print(f"== {name}: {results[name]['status']} in {seconds:.0f} s", flush=True)
    now = datetime.datetime.now(datetime.UTC)
    return {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "quick": quick,
        "machine": machine(),
        "benchmarks": results,
    }


def markdown_table(results: dict) -> str:
    """The table of every headline figure, with the machine and date it was measured on (and,
    for benchmarks re-run alone since, the note of each re-run)."""
    m = results["machine"]
    quick = " (quick sizes)" if results["quick"] else ""
    measured = (
        f"Measured {results['date']}{quick} on {m['cpu']}, {m['cores']} cores, {m['memory']}, "
        f"{m['os']}; Python {m['python']}, torch {m['torch']}, commit {m['commit']}. Ratios are "
        "against a baseline run at the same time."
    )
    lines = [
        measured,
        "",
        "| benchmark | figure | value | target | met |",
        "|---|---|---:|---|---|",
    ]
    for name, result in results["benchmarks"].items():
        if result["status"] != "ok":
            lines.append(f"| {name} | {result['status']} | | | |")
        for figure in result["figures"]:
            met = {True: "yes", False: "**no**", None: ""}[figure["met"]]
            label = figure["name"].replace("|", "\\|")  # a pipe would end the cell
            lines.append(
                f"| {name} | {label} | {figure['value']:.3g} | {figure['target']} | {met} |"
            )
    reruns = [(name, r["rerun"]) for name, r in results["benchmarks"].items() if r.get("rerun")]
    if reruns:  # their figures are not from the run named above
        lines += ["", "Benchmarks re-run alone since:", ""]
        lines += [f"* {name}: {note}" for name, note in reruns]
    return "\n".join(lines) + "\n"


def with_table(readme: str, table: str) -> str:
    """``readme`` with the text between its bench-table markers replaced by ``table``."""
    start, end = readme.index(START_MARK) + len(START_MARK), readme.index(END_MARK)
    return readme[:start] + "\n" + table + readme[end:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a check in minutes")
    parser.add_argument(
        "--only", default=",".join(SUITE), help=f"comma-separated subset of {', '.join(SUITE)}"
    )
    parser.add_argument("--no-readme", action="store_true", help="leave README.md as it is")
    parser.add_argument("--out", type=Path, default=HERE, help="where results.json/.md go")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in SUITE]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(SUITE)}")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        results = run_suite(names, args.quick, Path(scratch))
    (args.out / RESULTS_JSON.name).write_text(json.dumps(results, indent=2) + "\n")
    table = markdown_table(results)
    (args.out / RESULTS_MD.name).write_text("# Benchmark results\n\n" + table)
    if not args.no_readme:
        README.write_text(with_table(README.read_text(), table))
    print(table)
    failed = [n for n, r in results["benchmarks"].items() if r["status"] != "ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
