"""Asking a shard what its standard gRPC health check says."""

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def serving_status(endpoint: str) -> int:
    """The overall ``HealthCheckResponse`` status of the shard at ``endpoint``."""
    with grpc.insecure_channel(endpoint) as channel:
        request = health_pb2.HealthCheckRequest()
        return health_pb2_grpc.HealthStub(channel).Check(request, timeout=10).status


def await_status(endpoint: str, status: int, timeout_s: float) -> None:
    """Return once the shard at ``endpoint`` reports ``status`` (its health Watch stream,
    no polling); AssertionError naming the last status seen after ``timeout_s``."""
    seen = None
    with grpc.insecure_channel(endpoint) as channel:
        stream = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(), timeout=timeout_s
        )
        try:
            for reply in stream:
                seen = reply.status
                if seen == status:
                    return
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
    raise AssertionError(f"{endpoint}: health {seen}, not {status}, after {timeout_s} s")
