"""The UCX client's deadline covers the whole call, and its event loop refuses to wait on itself.

A listener that takes the request and never answers stands in for a shard that hangs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from ember.ps_server.client.transport import ShardCall, TransportError
from ember.ps_server.client.ucx_transport import UcxTransport
from ember.ps_server.errors import Status
from ember.ps_server.ucx import load_ucx, ucx_loop
from ember.ps_server.wire.frames import END_MARK, HEADER_BYTES
from ember.ps_server.wire.stats import DataPlaneAddress
from ember.ps_server.wire.table_spec import TableSpec

from tests.support.raw_frames import assert_ucx_lookup_matches_pull, require_ucx

TIMEOUT_S = 0.5


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """The port of a UCX listener that reads a frame's header and then never answers."""
    require_ucx()
    ucx, loop = load_ucx(), ucx_loop()
    released = loop.run(_event())

    async def hang(endpoint) -> None:
        await endpoint.recv(np.empty(HEADER_BYTES, dtype=np.uint8))
        await released.wait()

    async def listen():
        return ucx.create_listener(hang)

    listener = loop.run(listen())
    try:
        yield listener.port
    finally:
        loop.loop.call_soon_threadsafe(released.set)
        loop.run(_close(listener))


async def _event() -> asyncio.Event:
    return asyncio.Event()


async def _close(listener) -> None:
    listener.close()


def _unreachable_locate(shard: int, within_s: float) -> DataPlaneAddress:
    raise AssertionError("a hanging shard is not lost: nothing to locate")


def test_a_shard_that_never_answers_is_deadline_exceeded_within_the_call_timeout(
    silent_listener,
):
    transport = UcxTransport(
        [DataPlaneAddress("ucx", "127.0.0.1", silent_listener)], 1 << 20, _unreachable_locate
    )
    try:
        failed, elapsed = _failed_call(transport)
    finally:
        transport.close()
    assert failed.status == Status.DEADLINE_EXCEEDED
    assert TIMEOUT_S <= elapsed < TIMEOUT_S + 2.0


def test_finding_a_lost_shard_again_counts_against_the_same_deadline(silent_listener):
    slow_lookup, asked = threading.Event(), []

    def locate(shard: int, within_s: float) -> DataPlaneAddress:  # a slow Stats call
        asked.append(within_s)
        slow_lookup.wait(10 * TIMEOUT_S)
        return DataPlaneAddress("ucx", "127.0.0.1", silent_listener)

    transport = UcxTransport([DataPlaneAddress("ucx", "127.0.0.1", 1)], 1 << 20, locate)
    transport._lost[0] = True  # as after a broken connection: its address is asked for again
    try:
        failed, elapsed = _failed_call(transport)
    finally:
        slow_lookup.set()
        transport.close()
    assert failed.status == Status.UNAVAILABLE  # retryable: the shard was not reached
    assert "did not say where its UCX listener is in time" in failed.details
    assert elapsed < TIMEOUT_S + 2.0  # not the lookup's 5 s
    assert len(asked) == 1 and asked[0] <= TIMEOUT_S  # it was given what was left


def test_calls_that_ran_past_their_deadline_leave_later_calls_working(
    silent_listener, client, table_name
):
    """Each expired call closes its endpoint with the reply's receive still posted; the
    process's later calls, on new endpoints, must still get their replies (ucxx 0.52 stops
    delivering active messages after such a close, so replies must not be sent as them)."""
    transport = UcxTransport(
        [DataPlaneAddress("ucx", "127.0.0.1", silent_listener)], 1 << 20, _unreachable_locate
    )
    try:
        for _ in range(3):
            assert _failed_call(transport)[0].status == Status.DEADLINE_EXCEEDED
    finally:
        transport.close()
    client.create_table(TableSpec(table_name, dim=4))
    assert_ucx_lookup_matches_pull(client, table_name, torch.arange(50))


def _failed_call(transport: UcxTransport) -> tuple[TransportError, float]:
    """The error of a Lookup to shard 0 with TIMEOUT_S, and the seconds it took."""
    started = time.monotonic()
    with pytest.raises(TransportError) as failed:
        transport.call(ShardCall(0, "Lookup", b"message" + END_MARK, tables=1), TIMEOUT_S)
    return failed.value, time.monotonic() - started


def test_a_blocking_call_on_the_ucx_loop_thread_is_refused_not_a_deadlock():
    require_ucx()
    loop = ucx_loop()

    async def nested() -> str:
        async def inner() -> str:
            return "never"

        try:
            loop.run(inner())
        except RuntimeError as error:
            return str(error)
        return "ran"

    assert "blocked the UCX event loop's own thread" in loop.run(nested())
