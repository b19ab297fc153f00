"""UCX test support: a raw endpoint to a shard's listener that sends whatever a test gives it,
and a check that the UCX data plane answers as gRPC does."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest
import torch
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.client.step_client import StepClient
from ember.ps_server.client.step_job import StepJob
from ember.ps_server.ucx import close_endpoint, load_ucx, ucx_errors, ucx_loop, ucx_missing
from ember.ps_server.wire.frames import END_MARK, HEADER_BYTES, FrameHeader

REPLY_LIMIT = 1 << 26


def require_ucx() -> None:
    """Skip, saying why, where no UCX binding loads; fail instead under EMBER_REQUIRE_UCX=1
    (``make test`` installs the binding, so there a missing one is a broken setup)."""
    if reason := ucx_missing():
        if os.environ.get("EMBER_REQUIRE_UCX") == "1":
            pytest.fail(f"EMBER_REQUIRE_UCX=1 but UCX cannot be loaded: {reason}")
        pytest.skip(f"UCX cannot be loaded here: {reason}")


def assert_ucx_lookup_matches_pull(client: PSClient, table: str, ids: torch.Tensor) -> None:
    """A step Lookup of ``ids`` over UCX, from a new client to ``client``'s shards, returns the
    rows ``client`` pulls."""
    with PSClient(client.endpoints, ClientConfig(transport="ucx")) as ucx_client:
        steps = StepClient(ucx_client, StepJob("ucx-check"))
        assert ucx_client.shard_rpc.data_plane.name == "ucx"
        rows, _ = steps.lookup({table: ids})
    assert torch.equal(rows[table], client.pull(table, ids))


class RawFrames:
    """Frames to the UCX listener at ``host:port``, sent as given; replies read back raw.

    Args:
        host: the listener's host.
        port: its port.
    """

    def __init__(self, host: str, port: int) -> None:
        self._ucx = load_ucx()
        self._errors = ucx_errors(self._ucx)
        self._address = (host, port)
        self._loop = ucx_loop()
        self._endpoint = None
        self.reconnects = 0
        self.reconnect()

    def reconnect(self) -> None:
        """A new endpoint (the old one, if any, closed)."""
        self._loop.run(self._reconnect())
        self.reconnects += 1

    async def _reconnect(self) -> None:
        await close_endpoint(self._endpoint, self._errors)
        self._endpoint = await self._ucx.create_endpoint(*self._address)

    def exchange(
        self, header: bytes, payload: bytes | None, timeout_s: float = 10.0
    ) -> tuple[FrameHeader, bytes] | None:
        """Send ``header`` and then ``payload`` (None: nothing after the header) as two
        messages; the reply's header and message, or None when the shard closed the endpoint
        without one."""
        return self._loop.run(asyncio.wait_for(self._exchange(header, payload), timeout_s))

    async def _exchange(self, header: bytes, payload: bytes | None):
        try:
            await self._endpoint.send(np.frombuffer(header, dtype=np.uint8))
            if payload is not None:
                await self._endpoint.send(np.frombuffer(payload, dtype=np.uint8))
            raw = np.zeros(HEADER_BYTES, dtype=np.uint8)
            await self._endpoint.recv(raw)
            reply = FrameHeader.decode(raw.data, REPLY_LIMIT)
            body = np.zeros(reply.payload_bytes, dtype=np.uint8)
            await self._endpoint.recv(body)
        except self._errors:
            return None
        assert bytes(body[-len(END_MARK) :]) == END_MARK
        return reply, bytes(body[: -len(END_MARK)])

    def close(self) -> None:
        """Close the endpoint."""
        self._loop.run(close_endpoint(self._endpoint, self._errors))
