"""Redis commands packed by numpy: MGET, MSET and DEL of fixed-size keys and values.

redis-py builds a Python object per argument and packs each; for batches of
equal-sized keys (``prefix`` + an 8-byte id) and values the RESP encoding is
a fixed record per row, so numpy fills the whole command in a few vector
operations. :func:`run_packed` sends such commands on one pooled connection
and reads their replies (parsed by redis-py's parser, hiredis when present).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import redis


def pack(*args: bytes) -> bytes:
    """One RESP command of a few arguments (e.g. MULTI, EXEC)."""
    parts = [b"*%d\r\n" % len(args)]
    parts += [b"$%d\r\n%b\r\n" % (len(arg), arg) for arg in args]
    return b"".join(parts)


def pack_keyed(
    head: list[bytes], prefix: bytes, ids: np.ndarray, values: np.ndarray | None = None
) -> bytes:
    """One command: the arguments ``head``, then per id the key ``prefix`` + the id's 8
    little-endian bytes, followed by that id's fixed-size record of ``values`` if given
    (``[b"MGET"]`` or ``[b"DEL"]`` with keys; ``[b"MSET"]`` with keys and values)."""
    key_head = b"$%d\r\n" % (len(prefix) + 8)
    fields = [("head", f"S{len(key_head)}"), ("prefix", f"S{len(prefix)}"), ("id", "<i8")]
    if values is not None:
        value_head = b"\r\n$%d\r\n" % values.dtype.itemsize
        fields += [("value_head", f"S{len(value_head)}"), ("value", f"V{values.dtype.itemsize}")]
    rows = np.empty(len(ids), dtype=[*fields, ("end", "S2")])
    rows["head"], rows["prefix"], rows["id"], rows["end"] = key_head, prefix, ids, b"\r\n"
    if values is not None:
        rows["value_head"] = value_head
        rows["value"] = values.view(f"V{values.dtype.itemsize}")
    per_id = 1 if values is None else 2
    arguments = b"".join(b"$%d\r\n%b\r\n" % (len(arg), arg) for arg in head)
    return b"*%d\r\n" % (len(head) + per_id * len(ids)) + arguments + rows.tobytes()


@contextlib.contextmanager
def pooled_connection(client: redis.Redis) -> Iterator[Any]:
    """One connection of ``client``'s pool, for several exchanges (a WATCH, then its
    transaction). Any error drops it, so a half-read connection is never reused."""
    pool = client.connection_pool
    connection = pool.get_connection()
    try:
        yield connection
    except BaseException:
        connection.disconnect()
        raise
    finally:
        pool.release(connection)


def run_on(connection: Any, commands: list[bytes]) -> list[Any]:
    """Send ``commands`` in one write on ``connection``; their replies in order."""
    connection.send_packed_command(commands)
    return [connection.read_response() for _ in commands]


def run_packed(client: redis.Redis, commands: list[bytes]) -> list[Any]:
    """Send ``commands`` in one write on one pooled connection; their replies in order."""
    with pooled_connection(client) as connection:
        return run_on(connection, commands)
