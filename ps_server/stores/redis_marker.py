"""RedisShardMarker: which shard of which cluster a Redis database holds, and since when.

Each shard keeps a marker key ``ember-shard:<k>`` (never under ``ember:``,
where rows live) holding its shard count and an epoch written when it started
on that database. At start a shard refuses a database that holds another
shard count's markers: those rows belong to other owners and would come back
re-initialised. While serving, every read and write of a Redis-backed table
carries a ``GET`` of the marker in the same pipeline; a marker that vanished
means the Redis was restarted without persistence, flushed or replaced, and
the shard stops serving (see ``ShardFault``) rather than hand out
re-initialised rows as if they were trained, unless the operator accepted an
empty store (``--accept-empty-store``).

A Redis that restarts with its persistence keeps the marker, but may have come
back from an older state (``appendfsync everysec`` loses up to a second of
writes; a replica promoted by a failover lags its primary): the shard records
the server's ``run_id`` when it starts serving and every new connection of its
stores checks it (:meth:`RedisShardMarker.checked_connection`): another server's
stops a shard that can rebuild its rows from a write-ahead log the same way; one
without a log goes on from what Redis holds, saying so.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid

import redis
from ember.ps_server.durability.shard_fault import ShardFault
from ember.ps_server.errors import (
    StoreCorruptError,
    StoreUnavailableError,
    TopologyMismatchError,
)
from ember.ps_server.stores.redis_connection import guarded
from ember.ps_server.stores.resp import pack

log = logging.getLogger(__name__)

MARKER_PREFIX = b"ember-shard:"
_FORMAT = "ember-shard-marker/1"


def marker_key(shard: int) -> bytes:
    """The marker key of ``shard``."""
    return MARKER_PREFIX + str(shard).encode()


class RedisShardMarker:
    """The marker of shard ``shard`` of ``num_shards`` in the Redis database at ``url``.

    Args:
        client: a connection to that database.
        url: the database's URL, password redacted (for messages).
        shard, num_shards: whose marker this is.
        fault: tripped when the marker vanishes while serving.
        accept_empty: write a new marker and go on instead (the operator's choice).
    """

    def __init__(
        self,
        client: redis.Redis,
        url: str,
        shard: int,
        num_shards: int,
        fault: ShardFault,
        accept_empty: bool = False,
    ) -> None:
        self.url = url
        self.key = marker_key(shard)
        self._client = client
        self._shard, self._num_shards = shard, num_shards
        self._fault = fault
        self._accept_empty = accept_empty
        self._expected: bytes | None = None  # armed once the shard serves
        self._run_id: bytes | None = None  # the server's, since the shard serves
        self._stops_on_restart = False
        self._lock = threading.Lock()

    def check_topology(self) -> None:
        """Refuse a database that holds markers of another shard count.

        Raises:
            TopologyMismatchError: it does (the way to reshard is named).
            StoreCorruptError: a marker is unreadable.
        """
        keys = guarded(
            self.url, lambda: list(self._client.scan_iter(match=MARKER_PREFIX + b"*", count=1000))
        )
        for key in keys:
            value = guarded(self.url, lambda key=key: self._client.get(key))
            if value is None:
                continue
            marker = _parse(key, value, self.url)
            if marker["num_shards"] != self._num_shards:
                count = marker["num_shards"]
                raise TopologyMismatchError(
                    f"redis at {self.url} holds the rows of a {count}-shard cluster (marker "
                    f"{key.decode()}), but this is shard {self._shard} of {self._num_shards}: "
                    "serving them would silently re-initialise every row that changes owner. "
                    f"To change the shard count: take a checkpoint of the {count}-shard "
                    f"cluster (ember checkpoint --dir D), then start the {self._num_shards} "
                    "shards with --restore D over an empty Redis database (another db number, "
                    "or FLUSHDB once the checkpoint is written)"
                )

    def start_serving(self, rebuilds: bool = False) -> None:
        """Write a new epoch of this shard's marker and check it from now on.

        Call once the rows the database holds are the shard's (as found, or
        rebuilt from a checkpoint and the log). A new epoch per start means an
        older process still serving this shard on the database notices the
        marker changed, and stops.

        Args:
            rebuilds: the shard's next start rebuilds its rows from a write-ahead log, so a
                restart of the Redis server stops the shard (see :meth:`checked_connection`);
                without one it goes on from what the restarted server holds, saying so.

        Raises:
            StoreUnavailableError: the server refused INFO (an ACL user needs ``+info``).
        """
        with self._lock:
            held = guarded(self.url, lambda: self._client.get(self.key))
            if held is None:
                log.info(
                    "redis at %s has no marker of shard %d: a new store", self.url, self._shard
                )
            else:
                _parse(self.key, held, self.url)
            try:
                self._run_id = guarded(self.url, lambda: _run_id(self._client.info("server")))
            except redis.ResponseError as error:  # NoPermissionError is one
                raise StoreUnavailableError(
                    f"redis at {self.url} refused INFO ({error}): a shard reads the server's "
                    "run_id to notice a restart; grant its ACL user +info"
                ) from error
            self._stops_on_restart = rebuilds
            self._write_new()

    @property
    def expected(self) -> bytes | None:
        """The marker value this process wrote (None until :meth:`start_serving`): read it
        before sending a read, and hand it to :meth:`verify` with what the read found."""
        return self._expected

    def command(self) -> bytes:
        """The packed ``GET`` of the marker, to send with a store's commands."""
        return pack(b"GET", self.key)

    def verify(self, held: bytes | None, expected: bytes | None) -> None:
        """Check the marker's value ``held`` as a read found it, ``expected`` being
        :attr:`expected` when the read was sent.

        With ``--accept-empty-store``, the first read to find the marker gone writes a new
        epoch; reads sent before that (they saw the same loss) then pass.

        Raises:
            ShardFailedError: the marker is gone or another process's (the shard stops serving).
        """
        if expected is None or held == expected:
            return
        with self._lock:
            current = self._expected
            if held == current:  # sent before, read after, another thread's new epoch
                return
            if held is None and self._accept_empty:
                if current == expected:  # the first to see this loss
                    log.warning(
                        "redis at %s lost the marker of shard %d: its rows are gone; going on "
                        "from freshly initialised rows (--accept-empty-store)",
                        self.url, self._shard,
                    )  # fmt: skip
                    self._write_new()
                return
        if held is None:
            reason = (
                f"redis at {self.url} lost this shard's marker {self.key.decode()} (written when "
                "the shard started): the Redis server was restarted without persistence, flushed "
                "or replaced, so the rows it held are gone, and serving would hand out "
                "re-initialised rows as if they were trained. Restart the shard with --wal (it "
                "rebuilds its rows from its checkpoint and log) or --restore CHECKPOINT; or, to "
                "go on from freshly initialised rows, restart it with --accept-empty-store"
            )
        else:
            reason = (
                f"redis at {self.url}: marker {self.key.decode()} was rewritten by another "
                "process (another shard process with this index uses the database); stop one"
            )
        # Lost rows are rebuilt by the shard's restart where it has a log; a second owner is
        # not a fault a restart repairs (each restart would take the shard from the other).
        self._fault.trip(reason, restartable=held is None and self._stops_on_restart)
        self._fault.check()

    def checked_connection(self, connection: redis.connection.AbstractConnection) -> None:
        """Set up a new connection of a store (redis-py's ``redis_connect_func``), then check
        that it reached the server the shard started serving on: another ``run_id`` means
        the Redis restarted (or failed over), maybe from an older state (see
        :meth:`_restarted`). A connection whose check fails is dropped.

        Raises:
            ShardFailedError: another server, or the marker lost or rewritten there.
        """
        try:
            connection.on_connect()
            with self._lock:
                known, expected = self._run_id, self._expected
            if known is None:  # not serving yet: recovery checks what the server holds
                return
            connection.send_command("INFO", "server")
            run_id = _run_id(connection.read_response())
            if run_id != known:
                connection.send_command("GET", self.key)
                held = connection.read_response()
                if held is None:  # gone: stops, unless the operator accepted an empty store
                    self.verify(held, expected)
                self._restarted(known, run_id, held)
        except BaseException:  # redis-py before 8 keeps a connection whose setup failed
            connection.disconnect()
            raise

    def _restarted(self, known: bytes, run_id: bytes, held: bytes | None) -> None:
        """The server's ``run_id`` changed from ``known``, and it holds the marker ``held``:
        stop the shard if it rebuilds from a log (unless the operator accepted an empty
        store), else go on, saying so (with a new epoch where an older one came back)."""
        was = (
            f"redis at {self.url} restarted (server run_id {run_id.decode()}, was {known.decode()})"
        )
        if self._accept_empty or not self._stops_on_restart:
            with self._lock:
                if self._run_id == run_id:  # another connection saw this restart first
                    return
                if held is not None and held != self._expected:  # from before this process
                    _parse(self.key, held, self.url)  # this shard's, not garbage: replaced
                    self._write_new()
                self._run_id = run_id  # once the new epoch is written: else checked again
            why = "--accept-empty-store" if self._accept_empty else "no write-ahead log"
            log.warning("%s; going on from what it holds (%s)", was, why)
            return
        self._fault.trip(
            f"{was} while this shard served from it: it may have come back from an older "
            "state (appendfsync everysec loses up to a second of writes; a promoted replica "
            "lags), so serving could hand out rows older than writes already acknowledged. "
            "Restart the shard: it rebuilds its rows from its checkpoint and write-ahead log",
            restartable=held == self._expected,  # another process's marker: an operator's
        )
        self._fault.check()

    def held(self) -> bool:
        """Whether the database holds this shard's marker (its rows were served from it)."""
        return guarded(self.url, lambda: self._client.get(self.key)) is not None

    def _write_new(self) -> None:
        value = json.dumps(
            {
                "format": _FORMAT,
                "shard": self._shard,
                "num_shards": self._num_shards,
                "epoch": uuid.uuid4().hex,
            },
            sort_keys=True,
        ).encode()
        guarded(self.url, lambda: self._client.set(self.key, value))
        self._expected = value


def _run_id(info: dict | bytes | str) -> bytes:
    """The ``run_id`` of an ``INFO server`` reply: redis-py's parsed dict, or the raw text
    a bare connection reads."""
    if isinstance(info, dict):
        return str(info["run_id"]).encode()
    text = info.decode() if isinstance(info, bytes) else info
    for line in text.splitlines():
        if line.startswith("run_id:"):
            return line.partition(":")[2].strip().encode()
    raise StoreCorruptError("redis answered INFO server without a run_id")


def _parse(key: bytes, value: bytes, url: str) -> dict:
    try:
        marker = json.loads(value)
        if marker["format"] != _FORMAT or not isinstance(marker["num_shards"], int):
            raise ValueError(f"format {marker.get('format')!r}")
        return marker
    except (ValueError, KeyError, TypeError) as error:
        raise StoreCorruptError(
            f"redis at {url}: marker {key.decode(errors='replace')} is unreadable ({error})"
        ) from error
