"""The ``--endpoints`` / ``--endpoints-file`` flags of commands that talk to a cluster."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ember.env import env_value


def add_endpoint_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``--endpoints`` and ``--endpoints-file``."""
    parser.add_argument(
        "--endpoints",
        default=env_value("ENDPOINTS", ""),
        help="comma-separated shard endpoints in shard order (env EMBER_ENDPOINTS)",
    )
    parser.add_argument(
        "--endpoints-file",
        type=Path,
        default=env_value("ENDPOINTS_FILE", None, Path),
        help="JSON file written by `ember cluster up` (env EMBER_ENDPOINTS_FILE)",
    )


def endpoints_from_args(args: argparse.Namespace, command: str) -> list[str]:
    """The shard endpoints the flags name; exits with a message when there are none."""
    endpoints = [e for e in args.endpoints.split(",") if e]
    if args.endpoints_file is not None:
        try:
            endpoints = json.loads(args.endpoints_file.read_text())["endpoints"]
        except (OSError, ValueError, KeyError) as error:
            raise SystemExit(
                f"ember {command}: cannot read endpoints from {args.endpoints_file}: {error}"
            ) from None
    if not endpoints:
        raise SystemExit(f"ember {command}: give --endpoints or --endpoints-file")
    return endpoints
