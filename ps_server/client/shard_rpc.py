"""Calls to the shards: transports, concurrent fan-out, retries, and batching.

Calls to several shards run concurrently on a thread pool. gRPC carries every
call; the step calls (Lookup, Update) go over the data plane the config names
(see :mod:`ember.ps_server.client.data_plane`). A shard that is UNAVAILABLE
is retried with exponential backoff (a push keeps its request id and an
update its clock, so a retry is applied at most once), for longer where it says it is
restarting (see :mod:`~ember.ps_server.client.retries`); any other error
becomes a :class:`PSClientError` naming the shard. Pull, Push and PullStale
calls for several tables can be packed per shard into the batch RPCs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ember.ps_server.client.config import ClientConfig
from ember.ps_server.client.data_plane import open_data_plane
from ember.ps_server.client.fanout import FanOut, FanOutClosedError
from ember.ps_server.client.grpc_transport import GrpcTransport
from ember.ps_server.client.retries import CallRetries
from ember.ps_server.client.transport import STEP_METHODS, ShardCall, Transport, TransportError
from ember.ps_server.errors import PSClientError, Status
from ember.ps_server.security.credentials import load_token
from ember.ps_server.wire.messages import pb
from ember.ps_server.wire.stats import DataPlaneAddress

log = logging.getLogger(__name__)

__all__ = ["CONCURRENT_FAN_OUTS", "REQUEST_OVERHEAD_BYTES", "ShardCall", "ShardRPC"]

# Room for field tags, the table name and the request id beside the payload.
REQUEST_OVERHEAD_BYTES = 4096
# Fan-outs (a call to each shard) one client may have running at once: a trainer's
# pipeline keeps up to s+1 updates and a lookup in flight, and updates park on the shards
# until other ranks catch up, so a call queued behind them for a thread could stall every
# rank. The pool starts threads only as calls need them.
CONCURRENT_FAN_OUTS = 67


def fan_out_threads(shards: int) -> int:
    """Threads for a client of ``shards`` shards: every fan-out it may run at once."""
    return CONCURRENT_FAN_OUTS * shards


class ShardRPC:
    """Transports to every shard and the machinery to call them.

    Args:
        endpoints: ``host:port`` of every shard's gRPC service, in shard order.
        config: deadlines, retry policy, message limit and data plane.
    """

    def __init__(self, endpoints: Sequence[str], config: ClientConfig) -> None:
        self.endpoints = list(endpoints)
        self.config = config
        self._grpc = GrpcTransport(self.endpoints, config)
        self._data: Transport = self._grpc
        self._data_lock = threading.Lock()
        self._fan_out = FanOut(fan_out_threads(len(self.endpoints)))
        # Shards said to be restarting that have not answered a call since (logged once).
        self._restarting_shards: set[int] = set()
        self._restarting_lock = threading.Lock()

    @property
    def data_plane(self) -> Transport:
        """What carries the step calls (gRPC until :meth:`connect_data_plane`)."""
        return self._data

    def connect_data_plane(self, offered: Sequence[Sequence[DataPlaneAddress]]) -> None:
        """Choose the step calls' transport from what each shard offers (``offered[k]``),
        as the config's ``transport`` says; once.

        Raises:
            PSClientError: ``ucx`` was asked for and a shard offers none or cannot be reached.
            UcxUnavailableError: ``ucx`` was asked for and UCX cannot be loaded here.
        """
        with self._data_lock:
            if self._data is self._grpc:
                self._data = open_data_plane(
                    self.config.transport, self._grpc, self.endpoints, offered,
                    self.config.max_message_bytes, self.config.timeout_s,
                    load_token(self.config.token_file),
                )  # fmt: skip

    def close(self) -> None:
        """Stop the fan-out threads and close the transports."""
        self._fan_out.close()
        if self._data is not self._grpc:
            self._data.close()
        self._grpc.close()

    def run(
        self,
        calls: list[ShardCall],
        on_reply: Callable[[int, Any], None] | None = None,
        restart_patience_s: float | None = None,
    ) -> list[Any]:
        """Issue all calls concurrently; retry UNAVAILABLE ones with backoff, each within its
        :class:`CallRetries`; replies in order.

        ``on_reply(i, reply)`` runs on this thread as each reply arrives.
        ``restart_patience_s``: a shorter wait for a restarting shard than the config's.
        A call whose shard said it is restarting is sent again only once a cheap call
        (Stats) to it is answered, so its payload does not travel at every retry while the
        shard recovers (which refuses Stats too); one about to exit for a restart answers
        Stats in the second or so before it exits.
        """
        config = self.config
        patience_s = config.restart_patience_s
        if restart_patience_s is not None:
            patience_s = min(patience_s, restart_patience_s)
        replies: list[Any] = [None] * len(calls)
        retries = [CallRetries(config.max_attempts, patience_s) for _ in calls]
        pending = list(range(len(calls)))
        backoff = config.initial_backoff_s
        while True:
            retry, failure = [], None
            for k, (reply, error) in self._fan_out.as_completed(
                [self._invoker(calls[i], retries[i].restarting) for i in pending]
            ):
                i = pending[k]
                if isinstance(error, FanOutClosedError):
                    error = TransportError(Status.CANCELLED, str(error))
                if error is None:
                    if self._restarting_shards:
                        self._say_serving(calls[i].shard)
                    replies[i] = reply
                    if on_reply is not None:
                        on_reply(i, reply)
                elif not isinstance(error, TransportError):
                    raise error
                elif retries[i].retry(error):
                    if error.restarting:
                        self._say_restarting(calls[i].shard, error, patience_s)
                    retry.append(i)
                elif failure is None:
                    failure = self._client_error(calls[i], error, retries[i])
            if failure is not None:
                raise failure
            if not retry:
                return replies
            pending = retry
            time.sleep(backoff)
            backoff = min(2 * backoff, config.max_backoff_s)

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
            shard, members = groups[number]
            if len(batch_reply.responses) != len(members):
                raise PSClientError(
                    self.endpoints[shard], Status.INTERNAL,
                    f"{batch_method}: {len(batch_reply.responses)} answers to "
                    f"{len(members)} requests",
                )  # fmt: skip
            for index, reply in zip(members, batch_reply.responses):
                replies[index] = reply
                if on_reply is not None:
                    on_reply(index, reply)

        self.run(batches, on_reply=unpack)
        return replies

    def _invoker(self, call: ShardCall, probe_first: bool = False) -> Callable[[], Any]:
        """``call`` made; ``probe_first``: only once a Stats call to its shard is answered
        (its refusal, while the shard still restarts, stands for the call's)."""
        transport = self._data if call.method in STEP_METHODS else self._grpc
        timeout = self.config.timeout_s + call.extra_wait_s
        if not probe_first:
            return lambda: transport.call(call, timeout)
        probe = ShardCall(call.shard, "Stats", pb.StatsRequest(without_sizes=True))

        def probe_then_call() -> Any:
            try:
                self._grpc.call(probe, self.config.timeout_s)
            except TransportError as error:
                raise TransportError(
                    error.status, f"Stats, before sending it again: {error.details}",
                    restarting=error.restarting,
                ) from None  # fmt: skip
            return transport.call(call, timeout)

        return probe_then_call

    def _say_restarting(self, shard: int, error: TransportError, patience_s: float) -> None:
        """Log, once until it serves again, that ``shard`` is restarting and calls wait."""
        with self._restarting_lock:
            if shard in self._restarting_shards:
                return
            self._restarting_shards.add(shard)
        log.warning(
            "shard %s is restarting (%s): calls to it wait for it, up to %g s each",
            self.endpoints[shard], error.details, patience_s,
        )  # fmt: skip

    def _say_serving(self, shard: int) -> None:
        """Log that ``shard``, said to be restarting, answered a call."""
        with self._restarting_lock:
            if shard not in self._restarting_shards:
                return
            self._restarting_shards.discard(shard)
        log.info("shard %s serves again", self.endpoints[shard])

    def _client_error(
        self, call: ShardCall, error: TransportError, retries: CallRetries
    ) -> PSClientError:
        gave_up = retries.gave_up(error)
        details = f"{error.details} ({gave_up})" if gave_up else error.details
        return PSClientError(self.endpoints[call.shard], error.status, f"{call.method}: {details}")


_BATCHES = {
    "Pull": ("PullBatch", pb.PullBatchRequest),
    "Push": ("PushBatch", pb.PushBatchRequest),
    "PullStale": ("PullStaleBatch", pb.PullStaleBatchRequest),
}
