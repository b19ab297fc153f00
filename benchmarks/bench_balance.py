"""Load-balanced sequence batches: the straggler ratio of SASRec's ranks with each balancer.

One run, 2 trainer ranks under torchrun and 2 shards, SASRec on synthetic sequences with
heavy-tailed history lengths (items and users on the PS, step pipeline): the same global
batches split by ``none`` (equal contiguous chunks: the unbalanced baseline), ``count``
(zig-zag by length) and ``cost`` (equal sums of the calibrated per-sample cost). Each rank
times its own forward and backward per step; the straggler ratio is the slowest rank's
time over the mean, averaged over steps, then over --rounds runs of each balancer (the
balancers in turn). Also prints the model's held-out HR@10 against the
popularity baseline.

Usage: python benchmarks/bench_balance.py [--steps 100] [--batch-size 64] [--max-len 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ember.ps_server.cluster import LocalCluster
from figures import Figures, add_json_flag

BALANCERS = ("none", "count", "cost")


def run(
    endpoints: list[str], balancer: str, round_: int, args: argparse.Namespace, workdir: Path
) -> dict:
    """One 2-rank training run; rank 0's report."""
    report = workdir / f"{balancer}-{round_}.json"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "-m", "ember.cli.main", "train", "--model", "sasrec", "--endpoints", ",".join(endpoints),
        "--steps", str(args.steps), "--batch-size", str(args.batch_size), "--dim", "32",
        "--max-cardinality", str(args.items), "--max-len", str(args.max_len),
        "--dense-lr", "0.01", "--sparse-lr", "0.3",
        "--eval-batches", "4", "--no-progress", "--torch-threads", "1",
        "--balancer", balancer, "--table-prefix", f"balance-{balancer}-{round_}",
        "--report", str(report),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(command, check=True, env=env, timeout=1800, capture_output=True)
    return json.loads(report.read_text())


def averaged(reports: list[dict]) -> dict:
    """The first report with its timing figures averaged over every round."""
    timing = (
        "straggler_ratio", "predicted_straggler_ratio", "step_compute_max_s",
        "step_compute_mean_s", "samples_per_s",
    )  # fmt: skip
    return {
        **reports[0],
        **{key: statistics.fmean(r[key] for r in reports) for key in timing},
        "rounds": len(reports),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=64, help="samples per rank")
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each balancer")
    parser.add_argument(
        "--max-len", type=int, default=200, help="longest history (the tail reaches 200)"
    )
    add_json_flag(parser)
    args = parser.parse_args()
    print(
        f"SASRec dim 32, {args.items} items, histories up to {args.max_len}, 2 ranks x "
        f"{args.batch_size} samples, "
        f"{args.steps} steps, 2 shards; {os.cpu_count()} CPUs"
    )
    runs: dict[str, list[dict]] = {balancer: [] for balancer in BALANCERS}
    with LocalCluster(2) as cluster, tempfile.TemporaryDirectory() as workdir:
        for round_ in range(args.rounds):  # the balancers in turn: drift hits each alike
            for balancer in BALANCERS:
                runs[balancer].append(run(cluster.endpoints, balancer, round_, args, Path(workdir)))
    reports = {balancer: averaged(reports) for balancer, reports in runs.items()}
    print(
        f"\n{'balancer':<8} {'straggler':>9} {'predicted':>9} {'max ms':>7} {'mean ms':>7} "
        f"{'samples/s':>9} {'HR@10':>6} {'pop HR@10':>9}"
    )
    for balancer, r in reports.items():
        print(
            f"{balancer:<8} {r['straggler_ratio']:>9.3f} {r['predicted_straggler_ratio']:>9.3f} "
            f"{r['step_compute_max_s'] * 1000:>7.1f} {r['step_compute_mean_s'] * 1000:>7.1f} "
            f"{r['samples_per_s']:>9.0f} {r['heldout_hr10']:>6.3f} {r['popularity_hr10']:>9.3f}"
        )
    cost, none = reports["cost"], reports["none"]
    figures = Figures()
    figures.add("sasrec 2 ranks: straggler ratio with cost", cost["straggler_ratio"], at_most=1.15)
    figures.add("sasrec 2 ranks: straggler ratio unbalanced (none)", none["straggler_ratio"])
    figures.add(
        "sasrec: max-rank compute per step, cost / none",
        cost["step_compute_max_s"] / none["step_compute_max_s"],
    )
    figures.add(
        "sasrec HR@10 / popularity HR@10 (cost run)",
        cost["heldout_hr10"] / cost["popularity_hr10"],
        at_least=1.1,
    )
    print("\ntargets")
    for figure in figures.items:
        verdict = "" if figure.met is None else ("met" if figure.met else "MISSED")
        print(f"  {figure.name:<52} {figure.value:6.3f} {figure.target:>7} {verdict}")
    details = {
        balancer: {k: v for k, v in r.items() if k not in ("train_losses", "config")}
        for balancer, r in reports.items()
    }
    figures.write(args.json, details)
    return 0


if __name__ == "__main__":
    sys.exit(main())
