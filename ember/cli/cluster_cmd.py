"""``ember cluster``: run a cluster as local processes, or print its compose file.

``up --shards N`` starts N shards and keeps them until Ctrl-C / SIGTERM. ``up --config F``
runs the cluster file F (Redis, shards, trainer job; see :mod:`ember.deploy.cluster_file`):
with a trainer job it trains to the end and stops, without one it serves until stopped.
``compose --config F --out DIR`` writes the same topology as a compose file.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from ember.env import env_value
from ember.ps_server.cluster import write_endpoints_file


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``cluster`` subcommand group."""
    parser = commands.add_parser("cluster", help="run a local cluster, or print its compose file")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = actions.add_parser("up", help="run a cluster file, or N shards, as local processes")
    up.add_argument(
        "--config",
        type=Path,
        default=env_value("CLUSTER_CONFIG", None, Path),
        help="cluster file (TOML): Redis, shards, durability, trainer job (env EMBER_CLUSTER_CONFIG)",
    )
    up.add_argument(
        "--shards",
        type=int,
        default=env_value("SHARDS", 2),
        help="without --config: number of shards (env EMBER_SHARDS)",
    )
    up.add_argument(
        "--endpoints-file",
        type=Path,
        default=env_value("ENDPOINTS_FILE", Path("ember-endpoints.json"), Path),
        help="where the shard endpoints are written as JSON (env EMBER_ENDPOINTS_FILE)",
    )
    up.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="logs, ready files, and with --config Redis data, WAL, checkpoints and the "
        "trainer's report (default: a temp dir without --config, ./ember-cluster with it)",
    )
    up.set_defaults(run=run_up)
    compose = actions.add_parser(
        "compose", help="write the compose file (and Prometheus's config) of a cluster file"
    )
    compose.add_argument("--config", type=Path, required=True, help="cluster file (TOML)")
    compose.add_argument(
        "--out", type=Path, required=True, help="directory of compose.yaml (the Dockerfile's)"
    )
    compose.set_defaults(run=run_compose)


def _load(path: Path):
    from ember.deploy.cluster_file import load_cluster_file
    from ember.settings import SettingsError

    try:
        return load_cluster_file(path)
    except SettingsError as error:
        raise SystemExit(f"ember cluster: {error}") from None


def run_compose(args: argparse.Namespace) -> int:
    """Write the compose deployment's files; name them."""
    from ember.deploy.compose import rendered_files

    for name, text in rendered_files(_load(args.config), str(args.config)).items():
        path = args.out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 0


def run_up(args: argparse.Namespace) -> int:
    """Start the cluster, write the endpoints file, train or wait for a signal, stop cleanly."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if args.config is not None:
        return _run_file(args, stop)
    from ember.ps_server.cluster import LocalCluster

    if args.shards < 1:
        raise SystemExit(f"ember cluster up: --shards must be >= 1, got {args.shards}")
    with LocalCluster(args.shards, workdir=args.workdir) as cluster:
        return _serve(cluster.endpoints, cluster.processes, args.endpoints_file, stop)


def _run_file(args: argparse.Namespace, stop: threading.Event) -> int:
    from ember.deploy.local import LocalDeployment

    spec = _load(args.config)
    workdir = args.workdir or Path("ember-cluster")
    redis = "Redis, " if spec.redis is not None else ""
    print(f"starting {redis}{spec.shards} shards under {workdir} ...", flush=True)
    if spec.trainer is not None:
        # A signal unwinds the launcher, the trainer job with it; once: a second one must not
        # interrupt the stopping of the job, the shards and Redis.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _exit_once)
    with LocalDeployment(spec, workdir) as cluster:
        if spec.metrics:
            ports = [cluster.shards.ready_info[k]["metrics_port"] for k in range(spec.shards)]
            trainer = cluster.placement.trainer_metrics_port
            print(
                "metrics: shards at "
                + " ".join(f"http://127.0.0.1:{p}/metrics" for p in ports)
                + (
                    f"; trainer ranks from http://127.0.0.1:{trainer}/metrics up" if trainer else ""
                ),
                flush=True,
            )
        if spec.trainer is None:
            return _serve(cluster.endpoints, cluster.shards.processes, args.endpoints_file, stop)
        write_endpoints_file(cluster.endpoints, args.endpoints_file)
        try:
            status = _train(cluster, spec)
        finally:
            args.endpoints_file.unlink(missing_ok=True)
    return status


def _exit_once(number: int, _frame: object) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    sys.exit(128 + number)


def _train(cluster, spec) -> int:
    """Run the trainer job; print the summary and name the run report; its exit status."""
    from ember.cli.report_cmd import render_report
    from ember.cli.train_cmd import print_summary

    print(
        f"shards: {' '.join(cluster.endpoints)}; training on {spec.trainer.ranks} ranks "
        f"(log: {cluster.workdir / 'trainer.log'})",
        flush=True,
    )
    status = cluster.run_trainer()
    if status != 0:
        print(f"ember cluster: the trainer job failed with exit status {status}", file=sys.stderr)
        return status
    print_summary(json.loads((cluster.run_dir / "report.json").read_text()))
    print(f"run report: {render_report(cluster.run_dir)} (plots beside it)", flush=True)
    return 0


def _serve(endpoints, processes, endpoints_file: Path, stop: threading.Event) -> int:
    write_endpoints_file(endpoints, endpoints_file)
    print(f"{len(endpoints)} shards serving: {' '.join(endpoints)}", flush=True)
    print(f"endpoints written to {endpoints_file}; Ctrl-C to stop", flush=True)
    try:
        while not stop.wait(timeout=0.5):
            exited = [k for k, p in enumerate(processes) if p.poll() is not None]
            if exited:
                print(f"shard(s) {exited} exited; stopping the cluster", flush=True)
                return 1
    finally:
        endpoints_file.unlink(missing_ok=True)
    print("cluster stopped", flush=True)
    return 0
