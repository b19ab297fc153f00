"""The UCX data plane's client: Lookup and Update frames to each shard's UCX listener.

A call takes an idle endpoint to its shard (or connects a new one), sends the
request's header and message, and reads the reply's; the endpoint then goes
back to the idle set. An endpoint that failed, or whose call ran past its
deadline, is closed, never reused, so a late reply cannot answer a later
call. Failures map to the statuses gRPC gives: a lost or unreachable peer is
UNAVAILABLE (retried by the caller; a retried Update is deduplicated by its
clock on the shard), and the shard's address is asked for again before the
next connection, so a restarted shard is found on its new port (one lookup
per shard at a time, however many calls wait for it). One deadline covers a
call: no reply by then is DEADLINE_EXCEEDED; no connection (or no new address)
by then is UNAVAILABLE, so it is retried. A request over the message limit
(this client's, or the shard's where smaller) is RESOURCE_EXHAUSTED; a reply
that cannot be read INTERNAL; closing the client CANCELLED.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from ember.ps_server.client.transport import ShardCall, TransportError
from ember.ps_server.errors import EmberError, MessageTooLargeError, Status
from ember.ps_server.security.credentials import authorization_value
from ember.ps_server.ucx import (
    close_endpoint,
    endpoint_closed,
    load_ucx,
    ucx_errors,
    ucx_loop,
)
from ember.ps_server.wire.frames import (
    END_MARK,
    HEADER_BYTES,
    FrameError,
    FrameHeader,
    Op,
    payload_body,
)
from ember.ps_server.wire.stats import DataPlaneAddress
from ember.ps_server.wire.step_codec import decode_lookup_response, decode_update_response

_OPS = {"Lookup": Op.LOOKUP, "Update": Op.UPDATE}
_DECODERS: dict[Op, Callable[[memoryview], Any]] = {
    Op.LOOKUP: decode_lookup_response,
    Op.UPDATE: decode_update_response,
}


class UcxTransport:
    """Step calls over UCX to the listeners at ``addresses`` (shard k at ``addresses[k]``).

    Args:
        addresses: every shard's UCX listener (its host filled in).
        max_message_bytes: the largest request or reply, both ways (a request is also
            held to the shard's own limit, where its listener says it).
        locate: asks shard k for its listener's address again (after it was lost), within
            a timeout in seconds.
        token: the cluster's token, presented in a HELLO frame on every new connection
            (None: none).
    """

    name = "ucx"
    trailer = END_MARK

    def __init__(
        self,
        addresses: Sequence[DataPlaneAddress],
        max_message_bytes: int,
        locate: Callable[[int, float], DataPlaneAddress],
        token: bytes | None = None,
    ) -> None:
        self._ucx = load_ucx()
        self._errors = ucx_errors(self._ucx)
        self._addresses = list(addresses)
        self._lost = [False] * len(self._addresses)
        self._locate = locate
        self._hello = authorization_value(token).encode("ascii") + END_MARK if token else None
        self._max_message_bytes = max_message_bytes
        self._idle: list[list[Any]] = [[] for _ in self._addresses]
        self._request_ids = itertools.count(1)
        self._loop = ucx_loop()
        self._inflight: set[concurrent.futures.Future] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._locating: dict[int, asyncio.Future] = {}  # shards being asked where they are

    def connect(self, timeout_s: float) -> None:
        """Open one endpoint to every shard now (to find out whether UCX reaches them).

        Raises:
            TransportError: UNAVAILABLE naming the first shard that cannot be reached, or
                UNAUTHENTICATED where a shard refuses the token.
        """
        for shard in range(len(self._addresses)):
            deadline = self._loop.loop.time() + timeout_s
            self._idle[shard].append(self._loop.run(self._connect(shard, deadline)))

    def call(self, call: ShardCall, timeout_s: float) -> Any:
        """The decoded reply of a Lookup or Update ``call`` (its request ends with the trailer)."""
        self._check_size(call)  # against the limit last heard; again once connected
        self._loop.check_not_on_loop("a UCX call")
        with self._lock:
            if self._closed:
                raise TransportError(Status.CANCELLED, "the client is closed")
            future = self._loop.submit(self._call(call, timeout_s))
            self._inflight.add(future)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise TransportError(
                Status.CANCELLED, "the client was closed during the call"
            ) from None
        finally:
            with self._lock:
                self._inflight.discard(future)

    def close(self) -> None:
        """Cancel calls in flight (they fail with CANCELLED) and close idle endpoints."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            inflight = list(self._inflight)
        for future in inflight:
            future.cancel()
        self._loop.run(self._close_idle())

    async def _close_idle(self) -> None:
        for idle in self._idle:
            while idle:
                await close_endpoint(idle.pop(), self._errors)

    async def _call(self, call: ShardCall, timeout_s: float) -> Any:
        op = _OPS[call.method]
        request = FrameHeader(
            op, next(self._request_ids), len(call.request), call.tables, call.clock, call.dtype,
            restart_mark=True,  # this client reads it
        )  # fmt: skip
        deadline = asyncio.get_running_loop().time() + timeout_s  # connecting included
        endpoint = await self._endpoint(call.shard, deadline)
        try:
            self._check_size(call)  # the shard's limit, as a relocation may have renewed it
        except TransportError:
            self._idle[call.shard].append(endpoint)
            raise
        try:
            async with asyncio.timeout_at(deadline):
                reply, payload = await self._exchange(endpoint, request, call.request)
        except TimeoutError:
            await close_endpoint(endpoint, self._errors)
            raise TransportError(
                Status.DEADLINE_EXCEEDED, f"no reply within {timeout_s:.3g} s"
            ) from None
        except self._errors as error:
            self._lost[call.shard] = True
            await close_endpoint(endpoint, self._errors)
            raise TransportError(Status.UNAVAILABLE, f"UCX: {error}") from None
        except FrameError as error:
            await close_endpoint(endpoint, self._errors)
            too_large = isinstance(error, MessageTooLargeError)
            status = Status.RESOURCE_EXHAUSTED if too_large else Status.INTERNAL
            raise TransportError(status, f"unreadable reply: {error}") from None
        except asyncio.CancelledError:
            await close_endpoint(endpoint, self._errors)
            raise
        if reply.request_id == 0 or reply.status in (Status.UNAVAILABLE, Status.UNAUTHENTICATED):
            # the shard could not read our header, is stopping, or refused us: it closes its end
            await close_endpoint(endpoint, self._errors)
            if reply.status == Status.UNAVAILABLE:
                self._lost[call.shard] = True
        else:
            self._idle[call.shard].append(endpoint)
        if reply.status != Status.OK:
            details = bytes(payload).decode(errors="replace")
            raise TransportError(reply.status, details, restarting=reply.restart_mark)
        try:
            return _DECODERS[op](payload)
        except EmberError as error:
            raise TransportError(Status.INTERNAL, f"unreadable reply: {error}") from None

    def _check_size(self, call: ShardCall) -> None:
        """Refuse a request over this client's limit, or the shard listener's where it says a
        smaller one (RESOURCE_EXHAUSTED, as gRPC's limits are reported).

        Raises:
            TransportError: RESOURCE_EXHAUSTED.
        """
        theirs = self._addresses[call.shard].max_message_bytes
        limit = min(self._max_message_bytes, theirs) if theirs else self._max_message_bytes
        if len(call.request) > limit + len(END_MARK):
            raise TransportError(
                Status.RESOURCE_EXHAUSTED,
                f"request of {len(call.request) - len(END_MARK)} bytes is over the {limit}-byte "
                "message limit",
            )

    async def _endpoint(self, shard: int, deadline: float) -> Any:
        idle = self._idle[shard]
        while idle:
            endpoint = idle.pop()
            if not endpoint_closed(endpoint):
                return endpoint
            await close_endpoint(endpoint, self._errors)
            self._lost[shard] = True  # the shard may have restarted: ask where (and its limit)
        return await self._connect(shard, deadline)

    async def _connect(self, shard: int, deadline: float) -> Any:
        """A new endpoint to ``shard`` by ``deadline`` (the loop's clock), its address asked
        for again if the last one was lost."""
        if self._lost[shard]:
            await self._relocate(shard, deadline)
        try:
            async with asyncio.timeout_at(deadline):
                plane = self._addresses[shard]
                endpoint = await self._ucx.create_endpoint(
                    plane.host, plane.port, endpoint_error_handling=True
                )
                if self._hello is not None:
                    try:
                        await self._present_token(endpoint)
                    except BaseException:
                        await close_endpoint(endpoint, self._errors)
                        raise
                return endpoint
        except (TimeoutError, OSError, *self._errors) as error:
            self._lost[shard] = True
            plane = self._addresses[shard]
            raise TransportError(
                Status.UNAVAILABLE,
                f"cannot connect to UCX listener {plane.host}:{plane.port}: {error!r}",
            ) from None

    async def _present_token(self, endpoint: Any) -> None:
        """Send the HELLO frame a listener that requires the token reads first (the caller
        closes the endpoint if this raises).

        Raises:
            TransportError: the shard refused it (UNAUTHENTICATED) or its reply is unreadable.
        """
        hello = FrameHeader(Op.HELLO, next(self._request_ids), len(self._hello))
        try:
            reply, payload = await self._exchange(endpoint, hello, self._hello)
        except FrameError as error:
            raise TransportError(Status.INTERNAL, f"unreadable reply: {error}") from None
        if reply.status != Status.OK:
            raise TransportError(reply.status, bytes(payload).decode(errors="replace"))

    async def _relocate(self, shard: int, deadline: float) -> None:
        """Ask ``shard`` over gRPC where its listener is now, by ``deadline``; calls that need
        it meanwhile wait for the same answer.

        Raises:
            TransportError: UNAVAILABLE, no answer by the deadline or no listener offered.
        """
        loop = asyncio.get_running_loop()
        asking = self._locating.get(shard)
        if asking is None:
            remaining = max(0.001, deadline - loop.time())
            asking = loop.run_in_executor(None, self._locate, shard, remaining)
            self._locating[shard] = asking
            asking.add_done_callback(lambda _: self._locating.pop(shard, None))
        try:
            async with asyncio.timeout_at(deadline):
                self._addresses[shard] = await asyncio.shield(asking)
        except TimeoutError:
            raise TransportError(
                Status.UNAVAILABLE, f"shard {shard} did not say where its UCX listener is in time"
            ) from None
        self._lost[shard] = False

    async def _exchange(
        self, endpoint: Any, request: FrameHeader, message: bytes
    ) -> tuple[FrameHeader, memoryview]:
        await endpoint.send(np.frombuffer(request.encode(), dtype=np.uint8))
        await endpoint.send(np.frombuffer(message, dtype=np.uint8))
        raw = np.zeros(HEADER_BYTES, dtype=np.uint8)
        await endpoint.recv(raw)
        reply = FrameHeader.decode(raw.data, self._max_message_bytes + len(END_MARK))
        unread = reply.request_id == 0 and reply.status != Status.OK  # our header was refused
        answered = (reply.op, reply.request_id, reply.dtype)
        if not unread and answered != (request.op, request.request_id, request.dtype):
            raise FrameError(
                f"reply to {reply.op.name} #{reply.request_id} (dtype {reply.dtype}), "
                f"expected {request.op.name} #{request.request_id} (dtype {request.dtype})"
            )
        payload = np.empty(reply.payload_bytes, dtype=np.uint8)
        payload[-len(END_MARK) :] = 0
        await endpoint.recv(payload)
        return reply, payload_body(payload.data)
