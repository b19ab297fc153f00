"""``ember checkpoint``: write a consistent checkpoint of a running cluster."""

from __future__ import annotations

import argparse
from pathlib import Path

from ember.cli.endpoints import add_endpoint_flags, endpoints_from_args
from ember.env import env_value
from ember.ps_server.client.config import ClientConfig
from ember.settings import add_setting_flags, settings_from_args


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
    add_setting_flags(parser, ClientConfig)
    # A shard's write of a large table takes long; the client's default suits training calls.
    parser.set_defaults(timeout_s=env_value("TIMEOUT_S", 600.0, prefix=ClientConfig.ENV_PREFIX))
    add_endpoint_flags(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Take the checkpoint and print its directory."""
    from ember.ps_server.client.ps_client import PSClient
    from ember.ps_server.errors import PSClientError

    endpoints = endpoints_from_args(args, "checkpoint")
    try:
        with PSClient(endpoints, settings_from_args(ClientConfig, args)) as client:
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
