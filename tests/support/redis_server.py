"""A real redis-server on a free loopback port, for tests and benchmarks."""

from __future__ import annotations

from pathlib import Path

import pytest

from ember.deploy.redis_process import NO_SERVER, RedisProcess, redis_server_binary

__all__ = ["NO_SERVER", "RedisServer", "require_redis_server"]


def require_redis_server() -> None:
    """Skip the test, saying why, where no redis-server binary exists."""
    if redis_server_binary() is None:
        pytest.skip(NO_SERVER)


class RedisServer(RedisProcess):
    """A :class:`RedisProcess` without persistence that skips the test, saying why, where
    there is no redis-server."""

    def __init__(
        self, directory: Path, password: str | None = None, port: int | None = None
    ) -> None:
        require_redis_server()
        super().__init__(directory, password, port)
