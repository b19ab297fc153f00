"""``ember health ENDPOINT``: exit 0 when the shard's standard gRPC health check says SERVING.

Health needs no token; over TLS the client settings (``--tls-ca`` ...) say how to connect.
Container health checks run ``python -m ember.cli.health_cmd ENDPOINT`` instead, which
loads neither torch nor the rest of the CLI (a plaintext probe, in under a second).
"""

from __future__ import annotations

import argparse
import sys

from ember.ps_server.security.channels import open_channel

PROBE_TIMEOUT_S = 3.0


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``health`` subcommand."""
    from ember.env import env_value
    from ember.ps_server.client.config import ClientConfig
    from ember.settings import add_setting_flags

    parser = commands.add_parser("health", help="check that a shard serves (exit status 0)")
    parser.add_argument("endpoint", help="the shard's host:port")
    add_setting_flags(parser, ClientConfig)
    # A probe answers quickly or not at all; EMBER_CLIENT_TIMEOUT_S still overrides.
    timeout_s = env_value("TIMEOUT_S", PROBE_TIMEOUT_S, prefix=ClientConfig.ENV_PREFIX)
    parser.set_defaults(run=run, timeout_s=timeout_s)


def run(args: argparse.Namespace) -> int:
    """Probe with the client settings the flags give."""
    from ember.ps_server.client.config import ClientConfig
    from ember.settings import settings_from_args

    config = settings_from_args(ClientConfig, args)
    try:
        config.validate()
        return probe(
            args.endpoint, config.timeout_s, config.tls_ca, config.tls_cert, config.tls_key
        )
    except ValueError as error:
        raise SystemExit(f"ember health: {error}") from None


def probe(
    endpoint: str, timeout_s: float, tls_ca: str = "", tls_cert: str = "", tls_key: str = ""
) -> int:
    """Ask the shard at ``endpoint``; print its status; 0 if SERVING, 1 otherwise."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        with open_channel(endpoint, (), tls_ca, tls_cert, tls_key) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout_s
            )
    except grpc.RpcError as error:
        print(f"{endpoint}: {error.code().name}: {error.details()}")
        return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{endpoint}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m ember.cli.health_cmd HOST:PORT (plaintext; see ember health)")
    sys.exit(probe(sys.argv[1], PROBE_TIMEOUT_S))
