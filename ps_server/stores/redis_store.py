"""RedisStore: a table's rows on one shard, in Redis (``redis://`` or ``rediss://``).

One binary value per row (:mod:`row_codec`: header, weights, optimizer state,
version) under the key ``ember:<table>:s<shard>:`` + the id's 8 little-endian
bytes, so tables and shards never collide. Reads go out as pipelined MGETs of
at most ``batch_keys`` keys; a write is one MSET, or a MULTI/EXEC transaction
of MSETs when it needs several, so Redis applies a batch entirely or not at
all (deletes likewise). MGET and MSET are packed by numpy (:mod:`resp`), not
argument by argument. A lost connection raises
:class:`StoreUnavailableError` naming the URL (password redacted); the next
call reconnects. Every pipeline also reads the shard's marker
(:mod:`redis_marker`), so a Redis that lost its rows is noticed at once.
Deletes scan keys by their fixed prefix and keep only the keys of exactly the
expected shape: no glob ever reaches into the id bytes.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import redis
import torch
from ember.kernels.optim import RowOptimizer, fused_row_update
from ember.ps_server.errors import StoreUnavailableError
from ember.ps_server.stores.base import DUMP_CHUNK_ROWS, RowBatch, RowFactory, empty_batch
from ember.ps_server.stores.resp import pack, pack_mget, pack_mset, run_packed
from ember.ps_server.stores.row_codec import (
    DECODE_CHUNK_ROWS,
    HEADER_BYTES,
    RowRecords,
    decode_rows,
    encode_records,
    encode_rows,
)

if TYPE_CHECKING:
    from ember.ps_server.stores.redis_marker import RedisShardMarker

T = TypeVar("T")

DEFAULT_BATCH_KEYS = 65_536  # keys per MGET / MSET: well under 2^18, one command for most requests


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***``."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


class RedisStore:
    """Rows of one table on one shard, in Redis (the ``redis`` store).

    Args:
        url: ``redis://[user:password@]host:port/db`` or ``rediss://`` (TLS).
        table: table name (part of every key).
        shard: shard index (part of every key).
        dim: floats per row.
        state_width: optimizer-state floats per row.
        batch_keys: keys per MGET / MSET command.
        timeout_s: socket connect and read timeout.
        marker: the shard's marker, checked with every command pipeline (None: unchecked).

    Raises:
        StoreUnavailableError: Redis does not answer, or refuses the credentials.
    """

    def __init__(
        self,
        url: str,
        table: str,
        shard: int,
        dim: int,
        state_width: int,
        batch_keys: int = DEFAULT_BATCH_KEYS,
        timeout_s: float = 10.0,
        marker: RedisShardMarker | None = None,
    ) -> None:
        if batch_keys < 1:
            raise ValueError(f"batch_keys must be >= 1, got {batch_keys}")
        self.dim, self.state_width = dim, state_width
        self.url = redact(url)
        self._prefix = row_key_prefix(table, shard)
        self._batch = batch_keys
        self._value_bytes = HEADER_BYTES + 4 * (dim + state_width)
        self._marker = marker
        self._redis = connect(url, timeout_s)
        self._call(self._redis.ping)

    def footprint(self) -> tuple[int, int]:
        """``(rows, bytes of their values)`` from one key scan (Redis's own overhead not counted)."""
        rows = self.size()
        return rows, rows * self._value_bytes

    def fetch(self, ids: np.ndarray, with_state: bool = True) -> tuple[np.ndarray, RowBatch]:
        """``(found mask, rows)`` of ``ids`` (duplicates allowed); absent rows are zeros."""
        values = self._get(ids)
        if None not in values:  # the common case: decode straight into the batch
            found = np.ones(len(values), dtype=bool)
            return found, decode_rows(values, self.dim, self.state_width, self.url, with_state)
        found = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
        rows = empty_batch(len(ids), self.dim, self.state_width if with_state else 0)
        if found.any():
            held = [v for v in values if v is not None]
            rows.fill(found, decode_rows(held, self.dim, self.state_width, self.url, with_state))
        return found, rows

    def fetch_versions(self, ids: np.ndarray) -> tuple[np.ndarray, torch.Tensor]:
        """``(found mask, versions)``, 0 where absent."""
        found, rows = self.fetch(ids, with_state=False)
        return found, rows.versions

    def absent(self, ids: np.ndarray) -> np.ndarray:
        """A bool mask over ``ids``: true where no row is held."""
        return ~self.fetch_versions(ids)[0]

    def insert(self, ids: np.ndarray, rows: RowBatch) -> None:
        """Write the rows of distinct ``ids`` (upsert) in one transaction."""
        if len(ids) == 0:
            return
        self._set(
            ids,
            encode_records(
                RowBatch(
                    rows.weights.contiguous(), rows.state.contiguous(), rows.versions.contiguous()
                )
            ),
        )

    def update(
        self,
        ids: np.ndarray,
        grads: torch.Tensor,
        optimizer: RowOptimizer,
        create: RowFactory | None = None,
    ) -> None:
        """One optimizer step on the rows of distinct ``ids``: one read, one transaction.

        Absent rows are made by ``create`` first; without it KeyError, nothing changed.
        """
        values = self._get(ids)
        if None in values:
            missing = [i for i, value in enumerate(values) if value is None]
            if create is None:
                raise KeyError(f"update of {len(missing)} ids the store does not hold")
            for i, value in zip(missing, encode_rows(create(ids[missing])), strict=True):
                values[i] = value
        stepped = []
        for start in range(0, len(values), DECODE_CHUNK_ROWS):  # a small, reused scratch buffer
            part = slice(start, start + DECODE_CHUNK_ROWS)
            records = RowRecords(values[part], self.dim, self.state_width, self.url)
            # The fused op wants contiguous rows: step copies, then write them into the values.
            weights, state = records.weights.contiguous(), records.state.contiguous()
            slots = torch.arange(len(weights), dtype=torch.int64)
            fused_row_update(
                optimizer, weights, state, records.versions, slots, grads[part].contiguous()
            )
            records.weights.copy_(weights)
            records.state.copy_(state)
            stepped.append(records.final())
        self._set(ids, np.concatenate(stepped) if len(stepped) > 1 else stepped[0])

    def evict(self, ids: np.ndarray) -> None:
        """Delete the rows of ``ids`` in one transaction."""
        keys = self._keys(ids)
        self._call(lambda: delete_keys(self._redis, keys, self._batch))

    def dump(self, chunk_rows: int = DUMP_CHUNK_ROWS) -> Iterator[tuple[np.ndarray, RowBatch]]:
        """Every row of this table on this shard (SCAN, then MGET per chunk)."""
        keys = self._scan_keys()
        for start in range(0, len(keys), chunk_rows):
            yield self._read_keys(keys[start : start + chunk_rows])

    def clear(self) -> None:
        """Delete every row of this table on this shard."""
        keys = self._scan_keys()
        self._call(lambda: delete_keys(self._redis, keys, self._batch))

    def flush(self) -> None:
        """Nothing to do: every write is in Redis when the call returns."""

    def size(self) -> int:
        """Rows held (a SCAN over this table's keys on this shard: O(rows), for stats)."""
        return len(self._scan_keys())

    def _scan_keys(self) -> list[bytes]:
        """Every row key of this table on this shard: the prefix, then exactly 8 id bytes."""
        size = len(self._prefix) + 8
        return [
            key
            for key in self._call(lambda: scan_prefix(self._redis, self._prefix))
            if len(key) == size and key.startswith(self._prefix)
        ]

    def _read_keys(self, keys: list[bytes]) -> tuple[np.ndarray, RowBatch]:
        """The ids and rows behind ``keys`` (keys deleted since the SCAN are skipped)."""
        ids = np.frombuffer(b"".join(key[len(self._prefix) :] for key in keys), dtype="<i8")
        ids = ids.astype(np.int64)
        found, rows = self.fetch(ids)
        return (ids, rows) if found.all() else (ids[found], rows.select(found))

    def _keys(self, ids: np.ndarray) -> list[bytes]:
        size = len(self._prefix) + 8
        records = np.empty(len(ids), dtype=[("prefix", f"S{len(self._prefix)}"), ("id", "<i8")])
        records["prefix"] = self._prefix
        records["id"] = ids
        blob = records.tobytes()
        return [blob[i : i + size] for i in range(0, len(blob), size)]

    def _set(self, ids: np.ndarray, values: np.ndarray) -> None:
        """Write the value records of ``ids``: one MSET, or MULTI/EXEC around several."""
        if len(ids) == 0:
            return
        commands = [
            pack_mset(
                self._prefix, ids[start : start + self._batch], values[start : start + self._batch]
            )
            for start in range(0, len(ids), self._batch)
        ]
        if len(commands) > 1:
            commands = [pack(b"MULTI"), *commands, pack(b"EXEC")]
        self._run(commands)

    def _get(self, ids: np.ndarray) -> list[bytes | None]:
        """The value of each id (None where absent): pipelined MGETs."""
        if len(ids) == 0:
            return []
        commands = [
            pack_mget(self._prefix, ids[start : start + self._batch])
            for start in range(0, len(ids), self._batch)
        ]
        replies = self._run(commands)
        return replies[0] if len(replies) == 1 else [v for reply in replies for v in reply]

    def _run(self, commands: list[bytes]) -> list:
        """Send packed ``commands`` behind a read of the shard's marker; their replies."""
        if self._marker is None:
            return self._call(lambda: run_packed(self._redis, commands))
        held, *replies = self._call(
            lambda: run_packed(self._redis, [self._marker.command(), *commands])
        )
        self._marker.verify(held)
        return replies

    def _call(self, operation: Callable[[], T]) -> T:
        return guarded(self.url, operation)


def row_key_prefix(table: str, shard: int) -> bytes:
    """What every row key of ``table`` on ``shard`` starts with; the id's 8 bytes follow."""
    return f"ember:{table}:s{shard}:".encode()


def connect(url: str, timeout_s: float = 10.0) -> redis.Redis:
    """A client of the Redis at ``url`` (ValueError, password redacted, for a bad URL)."""
    try:
        return redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    except ValueError as error:
        raise ValueError(f"bad redis URL {redact(url)}: {error}") from error


def guarded(url: str, operation: Callable[[], T]) -> T:
    """Run ``operation``; a lost connection or refused login raises StoreUnavailableError."""
    try:
        return operation()
    except redis.AuthenticationError as error:
        raise StoreUnavailableError(f"redis at {url} refused the credentials: {error}") from error
    except (redis.ConnectionError, redis.TimeoutError) as error:
        raise StoreUnavailableError(f"redis at {url} is unreachable: {error}") from error


def scan_prefix(client: redis.Redis, prefix: bytes) -> list[bytes]:
    """Every key that starts with ``prefix`` (of glob-free characters), by SCAN."""
    return list(client.scan_iter(match=prefix + b"*", count=10_000))


def delete_keys(client: redis.Redis, keys: list[bytes], batch: int = DEFAULT_BATCH_KEYS) -> None:
    """Delete ``keys`` all or none: one DEL, or a MULTI/EXEC of several."""
    if not keys:
        return
    with client.pipeline(transaction=len(keys) > batch) as pipe:
        for start in range(0, len(keys), batch):
            pipe.delete(*keys[start : start + batch])
        pipe.execute()


def clear_shard_rows(url: str, shard: int) -> int:
    """Delete the rows of every table of ``shard`` at the Redis ``url``; returns how many.

    Keys are matched by their exact shape, from the end: ``ember:`` + a table
    name (which holds no ``:``) + ``:s<shard>:`` + exactly 8 id bytes. Rows of
    other shards stay whatever their id bytes hold.
    """
    client, tag = connect(url), f":s{shard}:".encode()
    keys = [
        key
        for key in guarded(redact(url), lambda: scan_prefix(client, b"ember:"))
        if len(key) > len(b"ember:") + len(tag) + 8
        and key[-8 - len(tag) : -8] == tag
        and b":" not in key[len(b"ember:") : -8 - len(tag)]
    ]
    guarded(redact(url), lambda: delete_keys(client, keys))
    return len(keys)
