"""Redis commands packed by numpy: MGET and MSET of fixed-size keys and values.

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


def pack_mget(prefix: bytes, ids: np.ndarray) -> bytes:
    """``MGET`` of the keys ``prefix`` + each id's 8 little-endian bytes."""
    key_head = b"$%d\r\n" % (len(prefix) + 8)
    rows = np.empty(
        len(ids),
        dtype=[("head", f"S{len(key_head)}"), ("prefix", f"S{len(prefix)}"), ("id", "<i8"),
               ("end", "S2")],
    )  # fmt: skip
    rows["head"], rows["prefix"], rows["id"], rows["end"] = key_head, prefix, ids, b"\r\n"
    return b"*%d\r\n$4\r\nMGET\r\n" % (len(ids) + 1) + rows.tobytes()


def pack_mset(prefix: bytes, ids: np.ndarray, values: np.ndarray) -> bytes:
    """``MSET`` of the keys ``prefix`` + id to the rows of ``values`` (one fixed-size record each)."""
    size = values.dtype.itemsize
    key_head = b"$%d\r\n" % (len(prefix) + 8)
    value_head = b"\r\n$%d\r\n" % size
    rows = np.empty(
        len(ids),
        dtype=[("head", f"S{len(key_head)}"), ("prefix", f"S{len(prefix)}"), ("id", "<i8"),
               ("value_head", f"S{len(value_head)}"), ("value", f"V{size}"), ("end", "S2")],
    )  # fmt: skip
    rows["head"], rows["prefix"], rows["id"] = key_head, prefix, ids
    rows["value_head"], rows["value"], rows["end"] = value_head, values.view(f"V{size}"), b"\r\n"
    return b"*%d\r\n$4\r\nMSET\r\n" % (2 * len(ids) + 1) + rows.tobytes()


@contextlib.contextmanager
def pooled_connection(client: redis.Redis) -> Iterator[Any]:
    """One connection of ``client``'s pool, for several exchanges (a WATCH, then its
    transaction). Any error drops it, so a half-read or watching connection is never reused."""
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
