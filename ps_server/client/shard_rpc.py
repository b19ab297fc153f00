"""Calls to the shards: channels, concurrent fan-out, retries, and batching.

Calls to several shards run concurrently on a thread pool. A shard that is
UNAVAILABLE is retried with exponential backoff (a push keeps its request id,
so a retry is applied at most once); any other error becomes a
:class:`PSClientError` naming the shard. Pull, Push and PullStale calls for
several tables can be packed per shard into the batch RPCs.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.client.fanout import FanOut
from ember.ps_server.errors import PSClientError
from ember.ps_server.wire.messages import SERVICE_NAME, message_size_options, pb, pb_grpc
from ember.ps_server.wire.pull_push_codec import decode_pull_reply
from ember.ps_server.wire.step_codec import decode_lookup_response, decode_update_response

# Room for field tags, the table name and the request id beside the payload.
REQUEST_OVERHEAD_BYTES = 4096


@dataclasses.dataclass(frozen=True)
class ShardCall:
    """One RPC: the shard's index, the method name and the request; ``extra_wait_s`` is
    added to the configured deadline (for a request the shard may hold that long)."""

    shard: int
    method: str
    request: Any
    extra_wait_s: float = 0.0


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


class ShardRPC:
    """Channels to every shard and the machinery to call them.

    Args:
        endpoints: ``host:port`` of every shard, in shard order.
        config: deadlines, retry policy and message limit.
    """

    def __init__(self, endpoints: Sequence[str], config: ClientConfig) -> None:
        self.endpoints = list(endpoints)
        self.config = config
        options = message_size_options(config.max_message_bytes)
        self._channels = [grpc.insecure_channel(e, options=options) for e in self.endpoints]
        self._stubs = [_DataPathStub(c) for c in self._channels]
        self._fan_out = FanOut(max_workers=max(8, 2 * len(self.endpoints)))

    def close(self) -> None:
        """Stop the fan-out threads and close the channels."""
        self._fan_out.close()
        for channel in self._channels:
            channel.close()

    def run(
        self, calls: list[ShardCall], on_reply: Callable[[int, Any], None] | None = None
    ) -> list[Any]:
        """Issue all calls concurrently; retry UNAVAILABLE ones with backoff; replies in order.

        ``on_reply(i, reply)`` runs on this thread as each reply arrives.
        """
        config = self.config
        replies: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        backoff = config.initial_backoff_s
        for attempt in range(1, config.max_attempts + 1):
            retry, failure = [], None
            for k, (reply, error) in self._fan_out.as_completed(
                [self._invoker(calls[i]) for i in pending]
            ):
                i = pending[k]
                if error is None:
                    replies[i] = reply
                    if on_reply is not None:
                        on_reply(i, reply)
                elif not isinstance(error, grpc.RpcError):
                    raise error
                elif error.code() == grpc.StatusCode.UNAVAILABLE and attempt < config.max_attempts:
                    retry.append(i)
                elif failure is None:
                    failure = self._client_error(calls[i], error, attempt)
            if failure is not None:
                raise failure
            if not retry:
                return replies
            pending = retry
            time.sleep(backoff)
            backoff = min(2 * backoff, config.max_backoff_s)
        raise AssertionError("unreachable: the last attempt either returns or raises")

    def run_packed(
        self,
        calls: list[ShardCall],
        sizes: list[int],
        on_reply: Callable[[int, Any], None] | None = None,
        single_table: bool = False,
    ) -> list[Any]:
        """Run Pull/Push/PullStale calls; for several tables, packed per shard into batch RPCs
        below the message limit, so a step costs one round trip per shard.

        ``on_reply(i, reply)`` gets each call's own reply, as in :meth:`run`.
        """
        if single_table or not calls:
            return self.run(calls, on_reply)
        method = calls[0].method
        batch_method, batch_type = _BATCHES[method]
        limit = self.config.max_message_bytes - REQUEST_OVERHEAD_BYTES
        groups: list[tuple[int, list[int]]] = []
        open_group: dict[int, tuple[list[int], int]] = {}
        for index, (call, size) in enumerate(zip(calls, sizes)):
            members, used = open_group.get(call.shard, ([], 0))
            if members and used + size > limit:
                groups.append((call.shard, members))
                members, used = [], 0
            members.append(index)
            open_group[call.shard] = (members, used + size)
        groups += [(shard, members) for shard, (members, _) in open_group.items()]
        batches = [
            ShardCall(shard, batch_method, batch_type(requests=[calls[i].request for i in members]))
            for shard, members in groups
        ]
        replies: list[Any] = [None] * len(calls)

        def unpack(number: int, batch_reply: Any) -> None:
            for index, reply in zip(groups[number][1], batch_reply.responses):
                replies[index] = reply
                if on_reply is not None:
                    on_reply(index, reply)

        self.run(batches, on_reply=unpack)
        return replies

    def _invoker(self, call: ShardCall) -> Callable[[], Any]:
        method = getattr(self._stubs[call.shard], call.method)
        timeout = self.config.timeout_s + call.extra_wait_s
        return functools.partial(method, call.request, timeout=timeout)

    def _client_error(self, call: ShardCall, error: grpc.RpcError, attempts: int) -> PSClientError:
        details = error.details() or ""
        if error.code() == grpc.StatusCode.UNAVAILABLE:
            details = f"{details} (gave up after {attempts} attempts)"
        return PSClientError(self.endpoints[call.shard], error.code(), f"{call.method}: {details}")


_BATCHES = {
    "Pull": ("PullBatch", pb.PullBatchRequest),
    "Push": ("PushBatch", pb.PushBatchRequest),
    "PullStale": ("PullStaleBatch", pb.PullStaleBatchRequest),
}
