"""``ember cluster up``: N shards as local processes until Ctrl-C / SIGTERM."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from ember.env import env_value


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``cluster`` subcommand group."""
    parser = commands.add_parser("cluster", help="run a local cluster of shards")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = actions.add_parser("up", help="start N shards on free ports and keep them running")
    up.add_argument(
        "--shards",
        type=int,
        default=env_value("SHARDS", 2),
        help="number of shards (env EMBER_SHARDS)",
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
        help="shard logs and ready files (default: a temp dir)",
    )
    up.set_defaults(run=run_up)


def run_up(args: argparse.Namespace) -> int:
    """Start the shards, write the endpoints file, wait for a signal, stop cleanly."""
    from ember.ps_server.cluster import LocalCluster

    if args.shards < 1:
        raise SystemExit(f"ember cluster up: --shards must be >= 1, got {args.shards}")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with LocalCluster(args.shards, workdir=args.workdir) as cluster:
        cluster.write_endpoints(args.endpoints_file)
        print(f"{args.shards} shards serving: {' '.join(cluster.endpoints)}", flush=True)
        print(f"endpoints written to {args.endpoints_file}; Ctrl-C to stop", flush=True)
        while not stop.wait(timeout=0.5):
            exited = [k for k, p in enumerate(cluster.processes) if p.poll() is not None]
            if exited:
                print(f"shard(s) {exited} exited; stopping the cluster", flush=True)
                args.endpoints_file.unlink(missing_ok=True)
                return 1
    args.endpoints_file.unlink(missing_ok=True)
    print("cluster stopped", flush=True)
    return 0
