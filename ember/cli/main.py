"""The ``ember`` command line: one console script with subcommands."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import NoReturn

from ember.cli import (
    certs_cmd,
    checkpoint_cmd,
    cluster_cmd,
    demo_cmd,
    doctor_cmd,
    health_cmd,
    plan_cmd,
    ps_cmd,
    report_cmd,
    train_cmd,
)
from ember.cli.process_exit import exit_finished_process, system_exit_status, teardown_asked
from ember.env import env_value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="ember",
        description="Ember parameter server for recommendation-model embeddings.",
    )
    parser.add_argument(
        "--log-level",
        default=env_value("LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level (env EMBER_LOG_LEVEL)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    ps_cmd.register(commands)
    cluster_cmd.register(commands)
    train_cmd.register(commands)
    checkpoint_cmd.register(commands)
    demo_cmd.register(commands)
    doctor_cmd.register(commands)
    certs_cmd.register(commands)
    health_cmd.register(commands)
    report_cmd.register(commands)
    plan_cmd.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``ember`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return args.run(args) or 0
    except KeyboardInterrupt:
        return 130


def console() -> NoReturn:
    """The ``ember`` console script and ``python -m ember.cli.main``: :func:`main`, then an
    exit that skips tearing down torch and the other loaded modules (~0.5 s a process, see
    :mod:`ember.cli.process_exit`). An exception other than SystemExit ends the process the
    usual way, with its traceback."""
    try:
        teardown = teardown_asked()
    except ValueError as error:
        raise SystemExit(f"ember: {error}") from None
    try:
        status = main()
    except SystemExit as stop:
        status = system_exit_status(stop)
    exit_finished_process(status, teardown)


if __name__ == "__main__":
    console()
