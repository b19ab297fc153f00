"""Asking a shard what its standard gRPC health check says."""

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def serving_status(endpoint: str) -> int:
    """The overall ``HealthCheckResponse`` status of the shard at ``endpoint``."""
    with grpc.insecure_channel(endpoint) as channel:
        request = health_pb2.HealthCheckRequest()
        return health_pb2_grpc.HealthStub(channel).Check(request, timeout=10).status
