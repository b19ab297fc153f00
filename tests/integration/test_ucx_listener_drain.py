"""A closing UCX listener drains as gRPC's stop does: the frame being handled finishes within
the grace period, and a frame that arrives meanwhile on an open endpoint is UNAVAILABLE. A
refusal says whether the shard is restarting, as gRPC's trailing metadata does, to a caller
that reads the restart mark (only)."""

from __future__ import annotations

import threading

from ember.ps_server.errors import ShardFailedError, ShardRestartingError, Status
from ember.ps_server.shard.call_watch import CallWatch
from ember.ps_server.shard.ucx_listener import UcxListener
from ember.ps_server.wire.frames import END_MARK, FrameHeader, Op

from tests.support.raw_frames import RawFrames, require_ucx

GRACE_S = 30.0


def test_a_closing_listener_finishes_the_frame_in_hand_and_refuses_new_ones():
    require_ucx()
    handling, release = threading.Event(), threading.Event()

    def parked_or_echo(header: FrameHeader, message: memoryview, call: CallWatch) -> bytes:
        if bytes(message) == b"first":
            handling.set()
            release.wait(GRACE_S)  # as a lookup parked for another rank's clock
        return bytes(message) + END_MARK

    listener = UcxListener({Op.LOOKUP: parked_or_echo}, 1 << 20, workers=4)
    first, second = RawFrames("127.0.0.1", listener.port), RawFrames("127.0.0.1", listener.port)
    asking = closing = None
    try:
        assert _ask(second, 1, b"hello")[1] == b"hello"  # the second endpoint is being served
        answer: list = []
        asking = threading.Thread(target=lambda: answer.append(_ask(first, 2, b"first")))
        asking.start()
        assert handling.wait(GRACE_S)
        closing = threading.Thread(target=listener.close, args=(GRACE_S,))
        closing.start()
        assert listener.closing.wait(GRACE_S)

        header, message = _ask(second, 3, b"late")
        assert (header.request_id, header.status) == (3, Status.UNAVAILABLE)
        assert b"stopping" in message

        release.set()
        asking.join(GRACE_S)
        closing.join(GRACE_S)
        assert not closing.is_alive()
        (finished,) = answer
        assert finished[0].status == Status.OK and finished[1] == b"first"
    finally:
        release.set()
        for thread in (asking, closing):
            if thread is not None:
                thread.join(GRACE_S)
        if closing is None:
            listener.close(0)
        first.close()
        second.close()


def test_a_refusal_says_whether_the_shard_is_restarting():
    require_ucx()

    def refuse(header: FrameHeader, message: memoryview, call: CallWatch) -> bytes:
        if bytes(message) == b"restarting":
            raise ShardRestartingError("the shard exits for a restart")
        raise ShardFailedError("the shard failed")

    listener = UcxListener({Op.LOOKUP: refuse}, 1 << 20, workers=2)
    raw = RawFrames("127.0.0.1", listener.port)
    try:
        restarting, message = _ask(raw, 1, b"restarting", restart_mark=True)
        assert (restarting.status, restarting.restart_mark) == (Status.UNAVAILABLE, True)
        assert b"exits for a restart" in message
        unread, _ = _ask(raw, 2, b"restarting")  # a caller from before the mark
        assert (unread.status, unread.restart_mark) == (Status.UNAVAILABLE, False)
        failed, _ = _ask(raw, 3, b"failed", restart_mark=True)
        assert (failed.status, failed.restart_mark) == (Status.FAILED_PRECONDITION, False)
    finally:
        raw.close()
        listener.close(0)


def _ask(raw: RawFrames, request_id: int, body: bytes, restart_mark: bool = False):
    """One Lookup frame of ``body`` and its reply ``(header, message)``."""
    payload = body + END_MARK
    header = FrameHeader(Op.LOOKUP, request_id, len(payload), restart_mark=restart_mark)
    reply = raw.exchange(header.encode(), payload)
    assert reply is not None, "the listener closed the endpoint without an answer"
    return reply
