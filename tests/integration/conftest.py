"""Real shard processes on free loopback ports, shared per test session."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.ucx import ucx_missing

from tests.support.raw_frames import require_ucx
from tests.support.redis_server import RedisServer, require_redis_server


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    """Two shards, default limits; serving UCX too where it loads."""
    with LocalCluster(2, [] if ucx_missing() else ["--ucx"]) as running:
        yield running


@pytest.fixture(params=["grpc", "ucx"])
def transport(request: pytest.FixtureRequest) -> str:
    """Each transport of the step calls in turn (ucx skipped, saying why, where it cannot load)."""
    if request.param == "ucx":
        require_ucx()
    return request.param


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[PSClient]:
    with PSClient(cluster.endpoints) as ps:
        yield ps


@pytest.fixture
def table_name(request: pytest.FixtureRequest) -> str:
    """A table name unique to the test, so tests sharing a cluster never interfere."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)[:120]


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the session (tests use distinct table names)."""
    require_redis_server()
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own, without persistence, in ``tmp_path / "redis"``."""
    require_redis_server()
    (tmp_path / "redis").mkdir()
    with RedisServer(tmp_path / "redis") as server:
        yield server
