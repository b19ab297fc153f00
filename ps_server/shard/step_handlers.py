"""Lookup and Update on a shard, from a decoded request to the reply's bytes, for every transport.

gRPC and the UCX frames carry the same messages; both end here, so a step
call means the same on either: ordering, clocks, deduplication and errors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember.ps_server.shard.call_watch import CallWatch
from ember.ps_server.shard.server import ParameterServer
from ember.ps_server.shard.step_rows import (
    state_bytes,
    wire_row_bytes,
    write_joined_rows,
    write_optimizer_state,
    write_wire_rows,
)
from ember.ps_server.wire.frames import END_MARK, FrameHeader, Op, check_header_matches
from ember.ps_server.wire.step_codec import (
    LookupRequestView,
    StepClockView,
    UpdateRequestView,
    decode_lookup_request,
    decode_update_request,
    encode_lookup_response,
    encode_update_response,
)

if TYPE_CHECKING:
    from ember.ps_server.shard.ucx_listener import FrameHandler


class StepHandlers:
    """The step calls of ``server``.

    Args:
        server: the shard's tables and step clocks.
    """

    def __init__(self, server: ParameterServer) -> None:
        self.server = server

    def lookup(
        self, request: LookupRequestView, trailer: bytes = b"", call: CallWatch | None = None
    ) -> bytes:
        """The serialised LookupResponse (then ``trailer``); ``call`` tells a wait for a
        clock that the caller is gone.

        Raises:
            OutOfRangeError: a row its entry's dtype cannot hold (nothing answered).
        """
        reads, watermark = self.server.steps.lookup(request, call)
        if request.joined_rows:  # one payload, filled in one pass
            return encode_lookup_response(
                [sum(wire_row_bytes(read) for read in reads)],
                lambda _, view: write_joined_rows(reads, view),
                watermark, trailer, joined_rows=True,
            )  # fmt: skip
        return encode_lookup_response(
            [wire_row_bytes(read) for read in reads],
            lambda index, view: write_wire_rows(reads[index], view),
            watermark, trailer,
        )  # fmt: skip

    def update(
        self, request: UpdateRequestView, trailer: bytes = b"", call: CallWatch | None = None
    ) -> bytes:
        """The serialised UpdateResponse (then ``trailer``); ``call`` as in :meth:`lookup`.

        Raises:
            OutOfRangeError: a read row its entry's dtype cannot hold (the clock stays
                applied; nothing answered).
        """
        answer = self.server.steps.update(request, call)
        flush = self.server.steps.replicas.asked(request.clock.job) if request.replica else ""
        return encode_update_response(
            answer.duplicate, answer.refreshed, answer.watermark, flush, trailer,
            sum(wire_row_bytes(read) for read in answer.reads),
            lambda view: write_joined_rows(answer.reads, view), state_bytes(answer.states),
            lambda view: write_optimizer_state(answer.states, view),
        )  # fmt: skip

    def frame_handlers(self) -> dict[Op, FrameHandler]:
        """The handlers of the UCX listener: a frame's header and message, and a watch of
        its connection, to the reply's message."""
        return {Op.LOOKUP: self._lookup_frame, Op.UPDATE: self._update_frame}

    def _lookup_frame(self, header: FrameHeader, message: memoryview, call: CallWatch) -> bytes:
        request = decode_lookup_request(message)
        _check_frame(header, len(request.tables), request.clock, request.tables)
        return self.lookup(request, END_MARK, call)

    def _update_frame(self, header: FrameHeader, message: memoryview, call: CallWatch) -> bytes:
        request = decode_update_request(message)
        rows = [*request.tables, *request.refresh, *request.read, *request.read_state]
        _check_frame(header, len(request.tables), request.clock, rows)
        return self.update(request, END_MARK, call)


def _check_frame(
    header: FrameHeader, tables: int, clock: StepClockView | None, row_entries: list
) -> None:
    """Refuse a frame whose header disagrees with its message (``row_entries``: the message's
    entries that carry or ask for rows)."""
    check_header_matches(
        header, tables, None if clock is None else clock.clock, [e.dtype for e in row_entries]
    )
