"""Choosing the step calls' transport: ``grpc``, ``ucx``, or ``auto`` (UCX where every shard
offers it and answers, gRPC otherwise, said once)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from ember.ps_server.client.transport import ShardCall, Transport, TransportError
from ember.ps_server.client.ucx_transport import UcxTransport
from ember.ps_server.errors import PSClientError, Status
from ember.ps_server.ucx import UcxUnavailableError
from ember.ps_server.wire.messages import pb
from ember.ps_server.wire.stats import DataPlaneAddress

log = logging.getLogger(__name__)
_said: set[str] = set()


def open_data_plane(
    kind: str,
    grpc: Transport,
    endpoints: Sequence[str],
    offered: Sequence[Sequence[DataPlaneAddress]],
    max_message_bytes: int,
    timeout_s: float,
    token: bytes | None = None,
) -> Transport:
    """The transport for the step calls, as ``kind`` asks, given what shard k offers in
    ``offered[k]``; ``grpc`` itself for gRPC. UCX connects to every shard (presenting
    ``token`` where given) before it is chosen.

    Raises:
        PSClientError: ``ucx`` was asked for and a shard offers no UCX listener
            (FAILED_PRECONDITION) or cannot be reached over UCX (UNAVAILABLE), naming it.
        UcxUnavailableError: ``ucx`` was asked for and UCX cannot be loaded here.
    """
    if kind == "grpc":
        return grpc
    addresses = [ucx_address(e, planes) for e, planes in zip(endpoints, offered, strict=True)]
    missing = [endpoint for endpoint, address in zip(endpoints, addresses) if address is None]
    if missing:
        reason = f"shard {missing[0]} offers no UCX listener (start shards with --ucx)"
        if kind == "ucx":
            raise PSClientError(missing[0], Status.FAILED_PRECONDITION, f"transport ucx: {reason}")
        _say_once(f"transport auto: step calls go over gRPC; {reason}")
        return grpc
    try:
        locate = _locator(grpc, endpoints, timeout_s)
        ucx = UcxTransport(addresses, max_message_bytes, locate, token)
    except UcxUnavailableError as error:
        if kind == "ucx":
            raise
        _say_once(f"transport auto: step calls go over gRPC; {error}")
        return grpc
    try:
        ucx.connect(timeout_s)
    except TransportError as error:
        ucx.close()
        if kind == "ucx":
            raise PSClientError(endpoints[0], error.status, f"transport ucx: {error.details}")
        _say_once(f"transport auto: step calls go over gRPC; {error.details}")
        return grpc
    return ucx


def ucx_address(endpoint: str, planes: Sequence[DataPlaneAddress]) -> DataPlaneAddress | None:
    """The UCX listener in ``planes`` (None: none offered), its host filled in: one that names
    no host is on the host of the shard's gRPC ``endpoint``."""
    for plane in planes:
        if plane.transport == "ucx":
            host = plane.host or endpoint.rsplit(":", 1)[0].strip("[]")
            return dataclasses.replace(plane, host=host)
    return None


def _locator(grpc: Transport, endpoints: Sequence[str], timeout_s: float):
    """Asks shard k for its UCX listener again, over gRPC (it may have restarted elsewhere)."""

    def locate(shard: int, within_s: float) -> DataPlaneAddress:
        stats = ShardCall(shard, "Stats", pb.StatsRequest(without_sizes=True))
        reply = grpc.call(stats, min(timeout_s, within_s))
        planes = [DataPlaneAddress.from_proto(plane) for plane in reply.data_planes]
        address = ucx_address(endpoints[shard], planes)
        if address is None:
            raise TransportError(Status.UNAVAILABLE, "the shard no longer offers a UCX listener")
        return address

    return locate


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        log.warning("%s", message)
