"""A closing UCX listener drains as gRPC's stop does: the frame being handled finishes within
the grace period, and a frame that arrives meanwhile on an open endpoint is UNAVAILABLE."""

from __future__ import annotations

import threading

from ember.ps_server.errors import Status
from ember.ps_server.shard.ucx_listener import UcxListener
from ember.ps_server.wire.frames import END_MARK, FrameHeader, Op

from tests.support.raw_frames import RawFrames, require_ucx

GRACE_S = 30.0


def test_a_closing_listener_finishes_the_frame_in_hand_and_refuses_new_ones():
    require_ucx()
    handling, release = threading.Event(), threading.Event()

    def parked(header: FrameHeader, message: memoryview) -> bytes:
        handling.set()
        release.wait(GRACE_S)  # as a lookup parked for another rank's clock
        return bytes(message) + END_MARK

    listener = UcxListener({Op.LOOKUP: parked}, 1 << 20, workers=4)
    first, second = RawFrames("127.0.0.1", listener.port), RawFrames("127.0.0.1", listener.port)
    payload = b"first" + END_MARK
    answer: list = []
    asking = threading.Thread(
        target=lambda: answer.append(
            first.exchange(FrameHeader(Op.LOOKUP, 1, len(payload)).encode(), payload)
        )
    )
    asking.start()
    assert handling.wait(GRACE_S)
    closing = threading.Thread(target=listener.close, args=(GRACE_S,))
    closing.start()
    assert listener.closing.wait(GRACE_S)

    late = b"late" + END_MARK
    reply = second.exchange(FrameHeader(Op.LOOKUP, 2, len(late)).encode(), late)
    assert reply is not None
    header, message = reply
    assert (header.request_id, header.status) == (2, Status.UNAVAILABLE)
    assert b"stopping" in message

    release.set()
    asking.join(GRACE_S)
    closing.join(GRACE_S)
    assert not closing.is_alive()
    (finished,) = answer
    assert finished is not None and finished[0].status == Status.OK and finished[1] == b"first"
    first.close()
    second.close()
