"""Which transport carries the step calls: as asked, refused with a reason, or auto's choice."""

from __future__ import annotations

import logging

import pytest
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.errors import PSClientError, Status

from tests.support.raw_frames import require_ucx


def _data_plane(endpoints: list[str], transport: str) -> str:
    with PSClient(endpoints, ClientConfig(transport=transport)) as client:
        client.ensure_topology()
        return client.shard_rpc.data_plane.name


def test_auto_takes_ucx_where_every_shard_offers_it(cluster) -> None:
    require_ucx()
    assert _data_plane(cluster.endpoints, "auto") == "ucx"
    assert _data_plane(cluster.endpoints, "grpc") == "grpc"


def test_without_a_ucx_listener_auto_says_so_once_and_ucx_refuses(caplog) -> None:
    with LocalCluster(1) as plain, caplog.at_level(logging.WARNING):
        assert [_data_plane(plain.endpoints, "auto") for _ in range(3)] == ["grpc"] * 3
        said = [
            r.getMessage() for r in caplog.records if "offers no UCX listener" in r.getMessage()
        ]
        assert len(said) == 1 and plain.endpoints[0] in said[0]
        with pytest.raises(PSClientError) as refused:
            _data_plane(plain.endpoints, "ucx")
    assert refused.value.code == Status.FAILED_PRECONDITION
    assert "start shards with --ucx" in refused.value.details
