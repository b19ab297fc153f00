"""The gRPC transport: a channel per shard, every method, and gRPC errors as TransportError."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.client.transport import ShardCall, TransportError
from ember.ps_server.errors import Status
from ember.ps_server.security.channels import open_channel
from ember.ps_server.security.credentials import load_token
from ember.ps_server.wire.keepalive import keepalive_options
from ember.ps_server.wire.messages import (
    RESTARTING_KEY,
    SERVICE_NAME,
    message_size_options,
    pb,
    pb_grpc,
)
from ember.ps_server.wire.pull_push_codec import decode_pull_reply
from ember.ps_server.wire.step_codec import decode_lookup_response, decode_update_response


class _DataPathStub(pb_grpc.ParameterServerStub):
    """The generated stub with the data path (Pull replies, Push requests, Lookup and
    Update both ways) on the zero-copy codecs."""

    def __init__(self, channel: grpc.Channel) -> None:
        super().__init__(channel)
        self.Pull = channel.unary_unary(
            f"/{SERVICE_NAME}/Pull",
            request_serializer=pb.PullRequest.SerializeToString,
            response_deserializer=decode_pull_reply,
        )
        self.Push = channel.unary_unary(
            f"/{SERVICE_NAME}/Push",
            request_serializer=None,  # already encoded by encode_push_request
            response_deserializer=pb.PushResponse.FromString,
        )
        self.Lookup = channel.unary_unary(
            f"/{SERVICE_NAME}/Lookup",
            request_serializer=None,  # encoded by encode_lookup_request
            response_deserializer=decode_lookup_response,
        )
        self.Update = channel.unary_unary(
            f"/{SERVICE_NAME}/Update",
            request_serializer=None,  # encoded by encode_update_request
            response_deserializer=decode_update_response,
        )


# What a connection that the shard closed during setup most likely means.
_PLAINTEXT_HINT = (
    " (the shard closed the connection during setup: if it serves TLS, connect with --tls-ca)"
)
_TLS_HINT = (
    " (the TLS handshake failed: the shard may require mutual TLS, with a client certificate "
    "(--tls-cert, --tls-key) that its --tls-client-ca signed and that is still valid)"
)


def _says_restarting(error: grpc.RpcError) -> bool:
    """Whether the shard marked its UNAVAILABLE refusal as a restart's (see
    :data:`RESTARTING_KEY`; as over UCX, no other status may say so)."""
    if not isinstance(error, grpc.Call) or error.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    return any(key == RESTARTING_KEY for key, _ in error.trailing_metadata() or ())


def _closed_while_connecting(details: str) -> bool:
    return "failed to connect" in details and ("Socket closed" in details or "andshake" in details)


class GrpcTransport:
    """Calls to the shards at ``endpoints`` (shard k at ``endpoints[k]``) over gRPC.

    Args:
        endpoints: ``host:port`` of every shard.
        config: the message limit (both ways), TLS files and token file.

    Raises:
        ValueError: a TLS or token file that cannot be read, or a token too weak.
    """

    name = "grpc"
    trailer = b""

    def __init__(self, endpoints: Sequence[str], config: ClientConfig) -> None:
        options = message_size_options(config.max_message_bytes) + keepalive_options(
            config.keepalive_s, server=False
        )
        token = load_token(config.token_file)
        self._channels = [
            open_channel(e, options, config.tls_ca, config.tls_cert, config.tls_key, token)
            for e in endpoints
        ]
        self._stubs = [_DataPathStub(channel) for channel in self._channels]
        self._connect_hint = _TLS_HINT if config.tls_ca else _PLAINTEXT_HINT
        self._closed = False

    def call(self, call: ShardCall, timeout_s: float) -> Any:
        """The decoded reply of ``call``; a gRPC error becomes a TransportError of its status."""
        if self._closed:
            raise TransportError(Status.CANCELLED, "the client is closed")
        method = getattr(self._stubs[call.shard], call.method)
        try:
            return method(call.request, timeout=timeout_s)
        except ValueError:  # grpc's "Cannot invoke RPC on closed channel!"
            if self._closed:
                raise TransportError(Status.CANCELLED, "the client is closed") from None
            raise
        except grpc.RpcError as error:
            details = error.details() or ""
            if _closed_while_connecting(details):
                details += self._connect_hint
            raise TransportError(
                Status(error.code().value[0]), details, restarting=_says_restarting(error)
            ) from None

    def close(self) -> None:
        """Close the channels: calls in flight and later calls end CANCELLED."""
        self._closed = True
        for channel in self._channels:
            channel.close()
