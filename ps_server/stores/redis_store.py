"""RedisStore: a table's rows on one shard, in Redis (``redis://`` or ``rediss://``).

One binary value per row (:mod:`row_codec`: header, weights, optimizer state,
version) under the key ``ember:<table>:s<shard>:`` + the id's 8 little-endian
bytes, so tables and shards never collide. Reads go out as pipelined MGETs of
at most ``batch_keys`` keys; a write is one MSET, or a MULTI/EXEC transaction
of MSETs when it needs several, so Redis applies a batch entirely or not at
all (deletes likewise). MGET and MSET are packed by numpy (:mod:`resp`), not
argument by argument. A lost connection raises
:class:`StoreUnavailableError` naming the URL (password redacted); the next
call reconnects.

With the shard's marker (:mod:`redis_marker`), every read sends a ``GET`` of
it after the MGETs in the same pipeline, and every write is a transaction
conditional on it: ``WATCH`` the marker and read it (with the rows, for a
read-then-write), then ``MULTI`` .. ``EXEC``, which Redis aborts if the marker
changed in between. So a Redis that lost its rows, or another process that
took this shard over, is noticed before anything is written. Scans check the
marker when they end. Deletes scan keys by their fixed prefix and keep only
the keys of exactly the expected shape: no glob ever reaches into the id
bytes. (Users restricted by ACLs need ``@transaction``; proxies must pass
WATCH/MULTI through.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch
from ember.kernels.optim import RowOptimizer, fused_row_update
from ember.ps_server.stores.base import (
    DUMP_CHUNK_ROWS,
    RowBatch,
    RowFactory,
    empty_batch,
    weights_via_fetch,
)
from ember.ps_server.stores.redis_connection import (
    MarkedWrites,
    connect,
    guarded,
    redact,
    redis_errors,
)
from ember.ps_server.stores.resp import pack, pack_keyed, run_packed
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
        self._redis = connect(url, timeout_s, marker)
        self._writes = MarkedWrites(self._redis, self.url, marker)
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

    def fetch_weights(self, ids: np.ndarray, out: torch.Tensor) -> np.ndarray:
        """Weights of held ``ids`` into ``out``; returns the positions of absent ids."""
        return weights_via_fetch(self, ids, out)

    def fetch_state(self, ids: np.ndarray, state: torch.Tensor) -> torch.Tensor:
        """Versions of ``ids``, their state written into ``state``; 0 where absent (whole
        records are read)."""
        _, rows = self.fetch(ids)  # absent rows are zeros
        state.copy_(rows.state)
        return rows.versions

    def fetch_versions(self, ids: np.ndarray) -> tuple[np.ndarray, torch.Tensor]:
        """``(found mask, versions)``, 0 where absent."""
        found, rows = self.fetch(ids, with_state=False)
        return found, rows.versions

    def absent(self, ids: np.ndarray) -> np.ndarray:
        """A bool mask over ``ids``: true where no row is held."""
        return ~self.fetch_versions(ids)[0]

    def insert(self, ids: np.ndarray, rows: RowBatch) -> None:
        """Write the rows of distinct ``ids`` (upsert), all or none."""
        if len(ids) == 0:
            return
        values = encode_records(
            RowBatch(rows.weights.contiguous(), rows.state.contiguous(), rows.versions.contiguous())
        )
        with self._writes.transaction() as transaction:
            transaction.write(self._mset_commands(ids, values))

    def update(
        self,
        ids: np.ndarray,
        grads: torch.Tensor,
        optimizer: RowOptimizer,
        create: RowFactory | None = None,
    ) -> None:
        """One optimizer step on the rows of distinct ``ids``: one read, one write.

        Absent rows are made by ``create`` first; without it KeyError, nothing changed.
        """
        with self._writes.transaction() as transaction:
            values = _joined(transaction.read(self._mget_commands(ids))) if len(ids) else []
            stepped = self._stepped(ids, values, grads, optimizer, create)
            transaction.write(self._mset_commands(ids, stepped))

    def _stepped(
        self,
        ids: np.ndarray,
        values: list[bytes | None],
        grads: torch.Tensor,
        optimizer: RowOptimizer,
        create: RowFactory | None,
    ) -> np.ndarray:
        """The value records of ``ids`` after one step from ``values`` (absent: ``create``)."""
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
        return np.concatenate(stepped) if len(stepped) > 1 else stepped[0]

    def evict(self, ids: np.ndarray) -> None:
        """Delete the rows of ``ids``, all or none."""
        commands = [
            pack_keyed([b"DEL"], self._prefix, ids[start : start + self._batch])
            for start in range(0, len(ids), self._batch)
        ]
        with self._writes.transaction() as transaction:
            transaction.write(commands)

    def dump(self, chunk_rows: int = DUMP_CHUNK_ROWS) -> Iterator[tuple[np.ndarray, RowBatch]]:
        """Every row of this table on this shard (SCAN, then MGET per chunk of keys).

        A key SCAN may name twice (Redis rehashing meanwhile) comes out twice.
        """
        for keys in self._scanned_keys(chunk_rows):
            yield self._read_keys(keys)

    def clear(self) -> None:
        """Delete every row of this table on this shard (in batches: a restore, which
        calls it, is refused whole when it fails, and then deletes the rest)."""
        for keys in self._scanned_keys(self._batch):
            with self._writes.transaction() as transaction:
                transaction.write([pack(b"DEL", *keys)])

    def flush(self) -> None:
        """Nothing to do: every write is in Redis when the call returns."""

    def reserve(self, rows: int) -> None:
        """Nothing to do: Redis sizes itself."""

    def size(self) -> int:
        """Rows held (a SCAN over this table's keys on this shard: O(rows), for stats)."""
        return sum(len(keys) for keys in self._scanned_keys(self._batch))

    def _scanned_keys(self, chunk: int) -> Iterator[list[bytes]]:
        """This table's row keys on this shard (the prefix, then exactly 8 id bytes), in
        lists of up to ``chunk``, as SCAN finds them.

        The marker is checked once the scan is done, so a scan of an emptied Redis
        (which finds nothing, so reads no row) is noticed.
        """
        size = len(self._prefix) + 8
        pending: list[bytes] = []
        with redis_errors(self.url):
            for key in self._redis.scan_iter(match=self._prefix + b"*", count=10_000):
                if len(key) == size and key.startswith(self._prefix):
                    pending.append(key)
                if len(pending) == chunk:
                    yield pending
                    pending = []
        if pending:
            yield pending
        self._check_marker()

    def _read_keys(self, keys: list[bytes]) -> tuple[np.ndarray, RowBatch]:
        """The ids and rows behind ``keys`` (keys deleted since the SCAN are skipped)."""
        ids = np.frombuffer(b"".join(key[len(self._prefix) :] for key in keys), dtype="<i8")
        ids = ids.astype(np.int64)
        found, rows = self.fetch(ids)
        return (ids, rows) if found.all() else (ids[found], rows.select(found))

    def _mget_commands(self, ids: np.ndarray) -> list[bytes]:
        return [
            pack_keyed([b"MGET"], self._prefix, ids[start : start + self._batch])
            for start in range(0, len(ids), self._batch)
        ]

    def _mset_commands(self, ids: np.ndarray, values: np.ndarray) -> list[bytes]:
        return [
            pack_keyed(
                [b"MSET"],
                self._prefix,
                ids[start : start + self._batch],
                values[start : start + self._batch],
            )
            for start in range(0, len(ids), self._batch)
        ]

    def _get(self, ids: np.ndarray) -> list[bytes | None]:
        """The value of each id (None where absent): pipelined MGETs, then a read of the
        marker, so rows read from a store emptied before they were read are noticed."""
        if len(ids) == 0:
            return []
        commands = self._mget_commands(ids)
        if self._marker is None:
            return _joined(self._call(lambda: run_packed(self._redis, commands)))
        expected = self._marker.expected
        *replies, held = self._call(
            lambda: run_packed(self._redis, [*commands, self._marker.command()])
        )
        self._marker.verify(held, expected)
        return _joined(replies)

    def _check_marker(self) -> None:
        self._writes.check_marker()

    def _call(self, operation: Callable[[], T]) -> T:
        return guarded(self.url, operation)


def row_key_prefix(table: str, shard: int) -> bytes:
    """What every row key of ``table`` on ``shard`` starts with; the id's 8 bytes follow."""
    return f"ember:{table}:s{shard}:".encode()


def _joined(replies: list[list[bytes | None]]) -> list[bytes | None]:
    """The values of several MGET replies, in order."""
    if len(replies) == 1:
        return replies[0]
    return [value for reply in replies for value in reply]


def clear_shard_rows(
    url: str, shard: int, marker: RedisShardMarker | None = None, batch: int = 10_000
) -> int:
    """Delete the rows of every table of ``shard`` at the Redis ``url``; returns how many.

    Keys are matched by their exact shape: ``ember:`` + a table name (which
    holds no ``:``) + ``:s<shard>:`` + exactly 8 id bytes, anchored at the end
    (Redis's ``?`` is one byte), and checked again here; rows of other shards
    stay whatever their id bytes hold. Keys are scanned and deleted in
    batches, so memory stays bounded however many rows there are (a restart
    that fails halfway simply deletes the rest next time). With the shard's
    ``marker`` each batch is deleted only while this process's epoch holds.
    """
    tag = f":s{shard}:".encode()
    pattern = b"ember:*" + tag + b"?" * 8

    def exact(key: bytes) -> bool:
        return key[-8 - len(tag) : -8] == tag and b":" not in key[len(b"ember:") : -8 - len(tag)]

    client = connect(url, marker=marker)
    writes = MarkedWrites(client, redact(url), marker)
    deleted = 0
    try:
        pending: list[bytes] = []
        with redis_errors(redact(url)):
            keys = client.scan_iter(match=pattern, count=batch)
            for key in (*keys, None):  # None: the end, to delete what is pending
                if key is not None and exact(key):
                    pending.append(key)
                if pending and (key is None or len(pending) >= batch):
                    with writes.transaction() as transaction:
                        transaction.write([pack(b"DEL", *pending)])
                    deleted, pending = deleted + len(pending), []
    finally:
        client.close()
    return deleted
