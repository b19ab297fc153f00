"""``ember checkpoint``: write a consistent checkpoint of a running cluster."""

from __future__ import annotations

import argparse
from pathlib import Path

from ember.cli.endpoints import add_endpoint_flags, endpoints_from_args
from ember.env import env_value


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``checkpoint`` subcommand."""
    parser = commands.add_parser(
        "checkpoint",
        help="checkpoint every shard at one moment into a new directory under --dir",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        required=env_value("CHECKPOINT_DIR", None) is None,
        default=env_value("CHECKPOINT_DIR", None, Path),
        help="checkpoint root, a path every shard can write (env EMBER_CHECKPOINT_DIR)",
    )
    parser.add_argument(
        "--incremental",
        action="store_true",
        help="write only rows changed since the newest checkpoint under --dir",
    )
    parser.add_argument(
        "--flush-wait-s",
        type=float,
        default=60.0,
        help="how long training jobs with hot-row replicas may take to write them back "
        "first (default 60); the checkpoint fails, naming them, if one does not",
    )
    parser.add_argument(
        "--release-job",
        action="append",
        default=[],
        metavar="JOB",
        help="a training job that died holding hot-row replicas: stop waiting for it (its "
        "rows are in the checkpoint as last written back); repeatable",
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=600.0,
        help="deadline of each shard's write (default 600)",
    )
    add_endpoint_flags(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Take the checkpoint and print its directory."""
    from ember.ps_server.client.config import ClientConfig
    from ember.ps_server.client.ps_client import PSClient
    from ember.ps_server.errors import PSClientError

    endpoints = endpoints_from_args(args, "checkpoint")
    if not args.timeout_s > 0:
        raise SystemExit(f"ember checkpoint: --timeout-s must be > 0, got {args.timeout_s}")
    try:
        with PSClient(endpoints, ClientConfig(timeout_s=args.timeout_s)) as client:
            directory = client.checkpoint(
                args.dir,
                incremental=args.incremental,
                flush_wait_s=args.flush_wait_s,
                release=args.release_job,
            )
    except (ValueError, OSError, PSClientError) as error:
        raise SystemExit(f"ember checkpoint: {error}") from None
    print(f"checkpoint written: {directory}", flush=True)
    return 0
