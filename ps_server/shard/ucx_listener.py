"""The shard's UCX data plane: Lookup and Update frames served by the gRPC path's handlers.

Every endpoint is served by its own task, one call at a time, in order. A
handler runs on a thread pool (it may wait for other ranks' clocks), so a
slow call holds only its own endpoint. A frame whose message is malformed,
or whose header disagrees with it, is answered with INVALID_ARGUMENT and the
endpoint goes on; a frame that cannot be read (bad header, a payload cut
short, too long or too slow, a lost peer) is answered if it can be and ends
that endpoint only. At most ``workers`` frames are held at once, however many
endpoints peers open; a frame's payload must arrive, and its reply be sent,
within :data:`TRANSFER_DEADLINE_S` each (the handler itself is not bounded).
With a token, a connection's first frame must be a HELLO carrying it (read within
:data:`HELLO_DEADLINE_S`, outside the ``workers`` limit: it runs no handler); anything
else is refused UNAUTHENTICATED and the connection closed. Once closing, as gRPC's stop does, the listener takes no new connection and
answers a frame that arrives on an open one UNAVAILABLE (the client may retry
elsewhere), while frames already taken get the grace period to finish.

UCX listens on every interface (its listener takes a port, not an address):
shield the port as you would the gRPC one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from ember.ps_server.errors import (
    EmberError,
    InvalidArgumentError,
    ShardStoppingError,
    Status,
    UnauthenticatedError,
    marks_restart,
    status_for,
)
from ember.ps_server.security.credentials import token_matches
from ember.ps_server.shard.call_watch import CallWatch
from ember.ps_server.ucx import (
    UcxUnavailableError,
    close_endpoint,
    load_ucx,
    ucx_errors,
    ucx_loop,
)
from ember.ps_server.wire.frames import (
    END_MARK,
    HEADER_BYTES,
    MAX_HELLO_BYTES,
    FrameError,
    FrameHeader,
    Op,
    payload_body,
)

log = logging.getLogger(__name__)

# A frame's header and message, and its connection's caller, to the reply's message.
FrameHandler = Callable[[FrameHeader, memoryview, CallWatch], bytes]
TRANSFER_DEADLINE_S = 60.0
# How long a new connection to a listener that requires the token has to present it.
HELLO_DEADLINE_S = 5.0
# What an error reply answers when the request's own header could not be read.
_UNREAD_REQUEST = FrameHeader(Op.LOOKUP, 0, len(END_MARK))


class UcxListener:
    """Serves frames on a UCX listener until closed.

    Args:
        handlers: for each op, a function of the request's header and message, and a
            watch of its connection (ended when the peer goes), that returns the reply's
            message followed by the end mark (raising EmberError to refuse the request).
        max_message_bytes: the largest payload accepted.
        workers: frames held and handlers run at once.
        port: the port to listen on (0: a free one).
        token: the cluster's token: every connection must present it in a HELLO frame
            before anything else (None: none needed).

    Raises:
        UcxUnavailableError: no UCX binding, or the port cannot be listened on.
    """

    def __init__(
        self,
        handlers: Mapping[Op, FrameHandler],
        max_message_bytes: int,
        workers: int,
        port: int = 0,
        token: bytes | None = None,
    ) -> None:
        self._ucx = load_ucx()
        self._errors = ucx_errors(self._ucx)
        self._handlers = dict(handlers)
        self._token = token
        self._max_payload = max_message_bytes + len(END_MARK)
        self._loop = ucx_loop()
        self._slots = self._loop.run(_semaphore(workers))
        self._serving: set[asyncio.Task] = set()
        self._busy = 0
        self._idle = self._loop.run(_event())
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="ember-ucx")
        self.closing = threading.Event()  # set as close() begins: new frames are refused
        try:
            self._listener = self._loop.run(self._listen(port))
        except (*self._errors, OSError, RuntimeError) as error:
            self._pool.shutdown(wait=False)
            raise UcxUnavailableError(f"cannot listen for UCX on port {port}: {error}") from None
        self.port: int = self._listener.port

    async def _listen(self, port: int) -> Any:
        return self._ucx.create_listener(self._serve, port=port, endpoint_error_handling=True)

    def close(self, grace_s: float = 5.0) -> None:
        """Stop taking connections and frames, let frames being handled finish within
        ``grace_s``, then close every endpoint."""
        self.closing.set()
        self._loop.run(self._close(grace_s))
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _close(self, grace_s: float) -> None:
        self._listener.close()
        if self._busy:
            try:
                await asyncio.wait_for(self._idle.wait(), grace_s)
            except TimeoutError:
                log.warning("closing the UCX listener with %d frame(s) unanswered", self._busy)
        for task in list(self._serving):
            task.cancel()
        await asyncio.gather(*self._serving, return_exceptions=True)

    async def _serve(self, endpoint: Any) -> None:
        if self.closing.is_set():  # accepted as the listener closed
            await close_endpoint(endpoint, self._errors)
            return
        task = asyncio.current_task()
        self._serving.add(task)
        caller = CallWatch()  # ended when the peer goes: its requests stop waiting for clocks
        endpoint.set_close_callback(caller.end)
        try:
            if self._token is None or await self._authenticate(endpoint):
                while await self._serve_one(endpoint, caller):
                    pass
        except (TimeoutError, *self._errors):
            pass  # the peer went away, or did not present the token in time
        except FrameError as error:
            log.warning("closing a UCX endpoint after an unreadable frame: %s", error)
        finally:
            caller.end()  # a handler still running (the listener closed) has nobody to answer
            self._serving.discard(task)
            await close_endpoint(endpoint, self._errors)

    async def _authenticate(self, endpoint: Any) -> bool:
        """Read the connection's first frame within :data:`HELLO_DEADLINE_S`: a HELLO with the
        token is answered OK (True); anything else is answered UNAUTHENTICATED, its payload
        unread, and the connection ends (False), as does a peer too slow to present it."""
        try:
            async with asyncio.timeout(HELLO_DEADLINE_S):
                return await self._read_hello(endpoint)
        except TimeoutError:
            log.warning("closing a UCX connection that did not present the token in time")
            return False

    async def _read_hello(self, endpoint: Any) -> bool:
        raw = np.zeros(HEADER_BYTES, dtype=np.uint8)
        await endpoint.recv(raw)
        try:
            header = FrameHeader.decode(raw.data, self._max_payload, request=True)
        except FrameError as error:
            await self._refuse(endpoint, _UNREAD_REQUEST, str(error))
            return False
        if header.op != Op.HELLO:
            await self._refuse(
                endpoint, header, "a connection must present the token first (HELLO)"
            )
            return False
        if header.payload_bytes > MAX_HELLO_BYTES + len(END_MARK):
            await self._refuse(endpoint, header, f"a HELLO is at most {MAX_HELLO_BYTES} bytes")
            return False
        # Zeroed: a message shorter than the buffer leaves the rest as it was, and a reused
        # buffer could hold an earlier connection's token.
        payload = np.zeros(header.payload_bytes, dtype=np.uint8)
        await endpoint.recv(payload)
        try:
            given = bytes(payload_body(payload.data))
        except FrameError:
            given = None
        if not token_matches(self._token, given):
            await self._refuse(endpoint, header, "no token" if not given else "wrong token")
            return False
        await _send(endpoint, header, Status.OK, END_MARK)
        return True

    async def _refuse(self, endpoint: Any, header: FrameHeader, reason: str) -> None:
        log.warning("refusing a UCX connection: %s", reason)
        await self._reply_error(endpoint, header, UnauthenticatedError(reason))

    async def _serve_one(self, endpoint: Any, caller: CallWatch) -> bool:
        """Answer one frame; whether the endpoint goes on (FrameError: it can no longer be
        trusted)."""
        raw = np.zeros(HEADER_BYTES, dtype=np.uint8)
        await endpoint.recv(raw)
        try:
            header = FrameHeader.decode(raw.data, self._max_payload, request=True)
        except FrameError as error:
            await self._reply_error(endpoint, _UNREAD_REQUEST, error)
            raise
        if self.closing.is_set():  # its payload is not read: the endpoint ends after this
            await self._reply_error(endpoint, header, ShardStoppingError("the shard is stopping"))
            return False
        if header.op == Op.HELLO:  # a token where none is needed, or presented again
            refusal = InvalidArgumentError("HELLO is only a connection's first frame")
            if self._token is None:  # accepted unread, as gRPC ignores a token it does not need
                refusal = None
            await self._reply_hello(endpoint, header, refusal)
            return refusal is None
        self._busy += 1  # counted while it waits for a slot too: close() lets it finish
        self._idle.clear()
        try:
            async with self._slots:
                await self._answer(endpoint, header, caller)
        finally:
            self._busy -= 1
            if not self._busy:
                self._idle.set()
        return True

    async def _reply_hello(
        self, endpoint: Any, header: FrameHeader, refusal: EmberError | None
    ) -> None:
        """Answer a HELLO outside the handshake without reading more than a HELLO's size."""
        if header.payload_bytes > MAX_HELLO_BYTES + len(END_MARK):
            await self._reply_error(endpoint, header, FrameError("a HELLO is at most 1 KiB"))
            raise FrameError(f"a HELLO of {header.payload_bytes} bytes")
        payload = np.zeros(header.payload_bytes, dtype=np.uint8)
        async with asyncio.timeout(TRANSFER_DEADLINE_S):
            await endpoint.recv(payload)
        if refusal is not None:
            await self._reply_error(endpoint, header, refusal)
        else:
            await _send(endpoint, header, Status.OK, END_MARK)

    async def _answer(self, endpoint: Any, header: FrameHeader, caller: CallWatch) -> None:
        payload = np.empty(header.payload_bytes, dtype=np.uint8)
        payload[-len(END_MARK) :] = 0
        try:
            async with asyncio.timeout(TRANSFER_DEADLINE_S):
                await endpoint.recv(payload)
            body = payload_body(payload.data)
        except (TimeoutError, *self._errors) as error:
            failure = FrameError(f"payload of {header.payload_bytes} bytes not received: {error!r}")
            await self._reply_error(endpoint, header, failure)
            raise failure from None
        except FrameError as error:
            await self._reply_error(endpoint, header, error)
            raise
        try:
            handler = self._handlers[header.op]
            reply = await self._loop.loop.run_in_executor(self._pool, handler, header, body, caller)
        except EmberError as error:
            await self._reply_error(endpoint, header, error)
            return
        except Exception as error:
            log.exception("UCX %s failed", header.op.name)
            await self._reply_error(endpoint, header, error)
            return
        await _send(endpoint, header, Status.OK, reply)

    async def _reply_error(self, endpoint: Any, request: FrameHeader, error: Exception) -> None:
        """Answer ``request`` with ``error``'s status and message, if the peer still listens."""
        status = status_for(error) if isinstance(error, EmberError) else Status.INTERNAL
        message = (
            str(error) if isinstance(error, EmberError) else f"{type(error).__name__}: {error}"
        )
        marked = request.restart_mark and marks_restart(error)  # only to a caller that reads it
        try:
            await _send(endpoint, request, status, message.encode() + END_MARK, marked)
        except (TimeoutError, *self._errors):
            pass


async def _send(
    endpoint: Any, request: FrameHeader, status: Status, payload: bytes, restart_mark: bool = False
) -> None:
    """Send a reply to ``request``: its header, then ``payload`` (end mark included);
    ``restart_mark``: the shard says it is restarting (see :attr:`FrameHeader.restart_mark`)."""
    reply = FrameHeader(
        request.op, request.request_id, len(payload), dtype=request.dtype, status=status,
        restart_mark=restart_mark,
    )  # fmt: skip
    async with asyncio.timeout(TRANSFER_DEADLINE_S):
        await endpoint.send(np.frombuffer(reply.encode(), dtype=np.uint8))
        await endpoint.send(np.frombuffer(payload, dtype=np.uint8))


async def _semaphore(slots: int) -> asyncio.Semaphore:
    """A semaphore made on the loop that will use it."""
    return asyncio.Semaphore(slots)


async def _event() -> asyncio.Event:
    """An event made on the loop that will use it, set."""
    event = asyncio.Event()
    event.set()
    return event
