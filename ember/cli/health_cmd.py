"""``ember health ENDPOINT``: exit 0 when the shard's standard gRPC health check says SERVING.

Container health checks and scripts use it; health needs no token, and over TLS the
client settings (``--tls-ca`` ...) say how to connect.
"""

from __future__ import annotations

import argparse

from ember.ps_server.client.config import ClientConfig
from ember.settings import add_setting_flags, settings_from_args


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``health`` subcommand."""
    parser = commands.add_parser("health", help="check that a shard serves (exit status 0)")
    parser.add_argument("endpoint", help="the shard's host:port")
    add_setting_flags(parser, ClientConfig)
    parser.set_defaults(run=run, timeout_s=3.0)


def run(args: argparse.Namespace) -> int:
    """Ask the shard; print its status; 0 if SERVING, 1 otherwise."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from ember.ps_server.security.channels import open_channel

    config = settings_from_args(ClientConfig, args)
    try:
        config.validate()
        with open_channel(
            args.endpoint, (), config.tls_ca, config.tls_cert, config.tls_key
        ) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=config.timeout_s
            )
    except ValueError as error:
        raise SystemExit(f"ember health: {error}") from None
    except grpc.RpcError as error:
        print(f"{args.endpoint}: {error.code().name}: {error.details()}")
        return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{args.endpoint}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1
