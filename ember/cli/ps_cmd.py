"""``ember ps``: run one parameter-server shard."""

from __future__ import annotations

import argparse
from pathlib import Path

from ember.env import env_value
from ember.ps_server.shard.config import ShardConfig
from ember.settings import add_setting_flags, settings_from_args


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``ps`` subcommand: a flag for every ShardConfig setting, and the ready file."""
    parser = commands.add_parser("ps", help="run one parameter-server shard")
    add_setting_flags(parser, ShardConfig)
    parser.add_argument(
        "--ready-file",
        type=Path,
        default=env_value("READY_FILE", None, Path),
        help="write {endpoint, shard, num_shards, pid} as JSON here once serving (env EMBER_READY_FILE)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT (or a fault, with --exit-on-fault); the exit status."""
    from ember.kernels.loader import KernelBuildError
    from ember.ps_server.errors import EmberError
    from ember.ps_server.shard.shard_server import serve_until_signalled
    from ember.ps_server.ucx import UcxUnavailableError

    config = settings_from_args(ShardConfig, args)
    try:
        config.validate()
        return serve_until_signalled(config, args.ready_file)
    except (ValueError, OSError, EmberError, KernelBuildError, UcxUnavailableError) as error:
        raise SystemExit(f"ember ps: {error}") from None
