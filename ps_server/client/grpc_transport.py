"""The gRPC transport: a channel per shard, every method, and gRPC errors as TransportError."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
from ember.ps_server.client.transport import ShardCall, TransportError
from ember.ps_server.errors import Status
from ember.ps_server.wire.messages import SERVICE_NAME, message_size_options, pb, pb_grpc
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


class GrpcTransport:
    """Calls to the shards at ``endpoints`` (shard k at ``endpoints[k]``) over gRPC.

    Args:
        endpoints: ``host:port`` of every shard.
        max_message_bytes: the largest request or reply, both ways.
    """

    name = "grpc"
    trailer = b""

    def __init__(self, endpoints: Sequence[str], max_message_bytes: int) -> None:
        options = message_size_options(max_message_bytes)
        self._channels = [grpc.insecure_channel(e, options=options) for e in endpoints]
        self._stubs = [_DataPathStub(channel) for channel in self._channels]

    def call(self, call: ShardCall, timeout_s: float) -> Any:
        """The decoded reply of ``call``; a gRPC error becomes a TransportError of its status."""
        method = getattr(self._stubs[call.shard], call.method)
        try:
            return method(call.request, timeout=timeout_s)
        except grpc.RpcError as error:
            raise TransportError(Status(error.code().value[0]), error.details() or "") from None

    def close(self) -> None:
        """Close the channels."""
        for channel in self._channels:
            channel.close()
