"""``ember demo``: 2 shards and 2 trainer ranks train DLRM on synthetic data locally."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from ember.cli.report_cmd import render_report
from ember.cli.train_cmd import add_training_flags, config_from_args, print_summary
from ember.deploy.topology import train_argv
from ember.env import env_value


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``demo`` subcommand."""
    parser = commands.add_parser(
        "demo", help="train DLRM with a local cluster: 2 shards and 2 trainer ranks under torchrun"
    )
    parser.add_argument(
        "--shards", type=int, default=env_value("DEMO_SHARDS", 2), help="number of shards"
    )
    parser.add_argument(
        "--ranks", type=int, default=env_value("DEMO_RANKS", 2), help="trainer ranks"
    )
    add_training_flags(parser)
    parser.set_defaults(
        run=run,
        steps=120,
        batch_size=512,
        max_cardinality=50_000,
        report=Path("ember-demo-report.json"),
        run_dir="ember-demo-run",
        cache="replicated",
        staleness=1,
        torch_threads=1,  # the shards share the cores
    )


def run(args: argparse.Namespace) -> int:
    """Start the shards, run the ranks with torchrun, print the summary, keep the report."""
    from ember.ps_server.cluster import LocalCluster

    if args.shards < 1 or args.ranks < 1:
        raise SystemExit("ember demo: --shards and --ranks must be >= 1")
    config_from_args(args, ["validate:0"])  # reject bad flags before starting anything
    print(f"starting {args.shards} shards ...", flush=True)
    with LocalCluster(args.shards) as cluster:
        print(f"shards: {' '.join(cluster.endpoints)}; training on {args.ranks} ranks", flush=True)
        config = config_from_args(args, cluster.endpoints)
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.ranks}",
            "-m", "ember.cli.main", "--log-level", "WARNING", "train", "--report", str(args.report),
            *train_argv(config),
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        result = subprocess.run(command, stdout=subprocess.DEVNULL, env=env, check=False)
        if result.returncode != 0:
            print(
                f"ember demo: training failed with exit status {result.returncode}", file=sys.stderr
            )
            return result.returncode
    report = json.loads(Path(args.report).read_text())
    print_summary(report)
    print(f"report written to {args.report}; shards stopped cleanly", flush=True)
    if config.run_dir:
        print(f"run report: {render_report(Path(config.run_dir))} (plots beside it)", flush=True)
    return 0
