"""``ember certs DIR``: a self-signed CA with server and client certificates, for local use."""

from __future__ import annotations

import argparse
from pathlib import Path

from ember.ps_server.security.certs import DEFAULT_SERVER_NAMES


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``certs`` subcommand."""
    parser = commands.add_parser(
        "certs", help="make a local CA and server and client certificates (TLS, mutual TLS)"
    )
    parser.add_argument("directory", type=Path, help="where the PEM files go (created)")
    parser.add_argument(
        "--server-name",
        action="append",
        dest="server_names",
        default=None,
        help="a DNS name or IP address the server certificate is valid for; repeat for "
        f"several (default: {', '.join(DEFAULT_SERVER_NAMES)})",
    )
    parser.add_argument("--days", type=int, default=365, help="validity of every certificate")
    parser.add_argument(
        "--ca",
        type=Path,
        default=None,
        help="sign with the CA in this directory (made by an earlier ember certs) instead of a new one",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Write the files and say how to use them."""
    from ember.ps_server.security.certs import make_certificates

    try:
        paths = make_certificates(
            args.directory,
            args.server_names or DEFAULT_SERVER_NAMES,
            days=args.days,
            ca_dir=args.ca,
        )
    except (OSError, ValueError) as error:
        raise SystemExit(f"ember certs: {error}") from None
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    if "ca.key" in paths:
        print(f"keep {paths['ca.key']} private: whoever holds it can issue certificates")
    print(
        f"shards: --tls-cert {paths['server.pem']} --tls-key {paths['server.key']} "
        f"[--tls-client-ca {paths['ca.pem']} for mutual TLS]"
    )
    print(
        f"clients: --tls-ca {paths['ca.pem']} [--tls-cert {paths['client.pem']} "
        f"--tls-key {paths['client.key']} for mutual TLS]"
    )
    return 0
