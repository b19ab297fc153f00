"""Redis connections and writes for the stores: connecting, error mapping, and
transactions that commit only while the shard's marker holds.

A lost connection or refused login raises :class:`StoreUnavailableError` naming
the URL it is given (callers pass it through :func:`redact`). :class:`MarkedWrites` runs a read-then-write
on one pooled connection: with the shard's marker (:mod:`redis_marker`) armed it
``WATCH``es the marker, reads it with the rows, and writes with ``MULTI`` ..
``EXEC``, which Redis aborts if the marker changed in between.
"""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import redis
from ember.ps_server.errors import StoreUnavailableError, StoreWriteUnknownError
from ember.ps_server.stores.resp import pack, pooled_connection, run_on, run_packed

if TYPE_CHECKING:
    from ember.ps_server.stores.redis_marker import RedisShardMarker

T = TypeVar("T")


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***``."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def connect(
    url: str, timeout_s: float = 10.0, marker: RedisShardMarker | None = None
) -> redis.Redis:
    """A client of the Redis at ``url`` (ValueError, password redacted, for a bad URL); with
    the shard's ``marker``, each connection it makes checks the server (see
    :meth:`RedisShardMarker.checked_connection`)."""
    try:
        return redis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            redis_connect_func=marker.checked_connection if marker is not None else None,
        )
    except ValueError as error:
        raise ValueError(f"bad redis URL {redact(url)}: {error}") from error


@contextlib.contextmanager
def redis_errors(url: str) -> Iterator[None]:
    """A lost connection or a refused login inside the block raises StoreUnavailableError."""
    try:
        yield
    except redis.AuthenticationError as error:
        raise StoreUnavailableError(f"redis at {url} refused the credentials: {error}") from error
    except (redis.ConnectionError, redis.TimeoutError) as error:
        raise StoreUnavailableError(f"redis at {url} is unreachable: {error}") from error


def guarded(url: str, operation: Callable[[], T]) -> T:
    """Run ``operation`` under :func:`redis_errors`."""
    with redis_errors(url):
        return operation()


class MarkedWrites:
    """Transactions on one Redis database that commit only while this process's epoch of
    the shard's marker holds there (WATCH, then MULTI/EXEC), or plain writes without one.

    Args:
        client: the database.
        url: its URL, password redacted (for messages).
        marker: the shard's marker (None: writes are not conditional).
    """

    def __init__(self, client: redis.Redis, url: str, marker: RedisShardMarker | None) -> None:
        self._redis, self._url, self._marker = client, url, marker

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """One connection for a read-then-write (or a write): see :class:`Transaction`.
        Connection failures are StoreUnavailableError; any error drops the connection."""
        with redis_errors(self._url), pooled_connection(self._redis) as connection:
            transaction = Transaction(connection, self._url, self._marker)
            yield transaction
            transaction.end()

    def check_marker(self) -> None:
        """Read the marker now and check it (see ``RedisShardMarker.verify``)."""
        if self._marker is not None:
            expected = self._marker.expected
            held = guarded(self._url, lambda: run_packed(self._redis, [self._marker.command()]))[0]
            self._marker.verify(held, expected)


class Transaction:
    """A read, then a write all or none, on one connection (from :meth:`MarkedWrites.transaction`).

    With an armed marker, :meth:`read` WATCHes it and reads it after the rows, and
    :meth:`write` runs MULTI/EXEC, which Redis aborts if the marker changed since the
    WATCH; a write with no read first WATCHes and checks the marker itself.
    """

    def __init__(self, connection: Any, url: str, marker: RedisShardMarker | None) -> None:
        self._connection, self._url = connection, url
        self._marker = marker if marker is not None and marker.expected is not None else None
        self._watching = False

    def read(self, commands: list[bytes]) -> list[Any]:
        """The replies of read ``commands``, with the marker watched and checked."""
        if self._marker is None:
            return run_on(self._connection, commands) if commands else []
        expected = self._marker.expected
        _, *replies, held = run_on(
            self._connection, [pack(b"WATCH", self._marker.key), *commands, self._marker.command()]
        )
        self._watching = True
        self._marker.verify(held, expected)
        return replies

    def write(self, commands: list[bytes]) -> None:
        """Run write ``commands`` all or none (one alone; several, or any under a marker,
        as MULTI/EXEC).

        Raises:
            ShardFailedError: the marker changed since it was read (nothing was written).
            StoreUnavailableError: an emptied store was accepted meanwhile: retry.
            StoreWriteUnknownError: the connection failed with the write in flight.
        """
        if not commands:
            return
        if self._marker is not None and not self._watching:
            self.read([])
        if self._marker is None and len(commands) == 1:
            self._in_flight(commands)
            return
        *_, applied = self._in_flight([pack(b"MULTI"), *commands, pack(b"EXEC")])
        self._watching = False  # EXEC ends the WATCH, whether it ran or not
        if applied is None:  # the marker changed since WATCH: nothing was written
            held = run_on(self._connection, [self._marker.command()])[0]
            self._marker.verify(held, self._marker.expected)
            raise StoreUnavailableError(
                f"redis at {self._url}: a write found this shard's marker changed; retry it"
            )
        for reply in applied:
            if isinstance(reply, Exception):
                raise reply

    def _in_flight(self, commands: list[bytes]) -> list[Any]:
        """Run a write's ``commands``; a connection lost meanwhile leaves its outcome unknown.

        Raises:
            StoreWriteUnknownError: the connection failed after the write may have been sent.
        """
        try:
            return run_on(self._connection, commands)
        except (redis.ConnectionError, redis.TimeoutError) as error:
            raise StoreWriteUnknownError(
                f"redis at {self._url}: the connection failed during a write, which may or "
                f"may not have been applied ({error})"
            ) from error

    def end(self) -> None:
        """Drop a WATCH no write ended, before the connection goes back to the pool."""
        if self._watching:
            run_on(self._connection, [pack(b"UNWATCH")])
            self._watching = False
