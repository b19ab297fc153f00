"""Hash routing of (table, id) pairs to shards.

Every id belongs to exactly one shard, chosen by a well-mixed 64-bit hash of
(table name, id). A bare ``id % num_shards`` would pile ids with structured
suffixes (``id * 1000 + 7``) into a few shards; the splitmix64 finaliser
spreads them evenly.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from ember.kernels.hash_map import mix64
from ember.kernels.loader import native_backend_for
from ember.ps_server.id_arrays import id_tensor


@functools.lru_cache(maxsize=4096)
def name_salt(name: str) -> np.uint64:
    """A stable 64-bit salt for a table name (blake2b, independent of PYTHONHASHSEED)."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    return np.uint64(int.from_bytes(digest, "little"))


def route_hash(table: str, ids: np.ndarray) -> np.ndarray:
    """64-bit routing hash of (table, id) for every id.

    Args:
        table: table name.
        ids: int64 array of ids.

    Returns:
        uint64 array, one hash per id.
    """
    return mix64(ids.view(np.uint64) ^ name_salt(table))


def shard_of(table: str, ids: np.ndarray, num_shards: int) -> np.ndarray:
    """The shard that owns each id of ``table`` on a cluster of ``num_shards``.

    Example:
        >>> shard_of("user", np.array([1, 2, 3], dtype=np.int64), 4).tolist()  # doctest: +SKIP
        [3, 0, 2]
    """
    return shard_of_tables([table], ids, np.array([len(ids)], dtype=np.int64), num_shards)


def shard_of_tables(
    tables: Sequence[str], ids: np.ndarray, ends: np.ndarray, num_shards: int
) -> np.ndarray:
    """The shard that owns each id, where ``ids[ends[t-1]:ends[t]]`` belong to ``tables[t]``:
    the ids of several tables routed in one pass."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    if num_shards == 1:
        return np.zeros(len(ids), dtype=np.int64)
    id_batch = id_tensor(ids)
    if native_backend_for(id_batch):  # the same function in one native pass
        salts = np.array([name_salt(table) for table in tables], dtype=np.uint64).view(np.int64)
        ends_batch = torch.from_numpy(np.ascontiguousarray(ends, dtype=np.int64))
        return torch.ops.ember.shard_of(
            id_batch, ends_batch, torch.from_numpy(salts), num_shards
        ).numpy()
    if len(tables) != len(ends) or (len(ends) and ends[-1] != len(ids)):
        raise ValueError(f"ends must finish at the {len(ids)} ids, one per table")
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    # Multiply-shift range reduction of the high 32 bits: no division, unbiased to
    # within num_shards / 2^32.
    high = np.concatenate(
        [route_hash(t, ids[a:b]) for t, a, b in zip(tables, starts, ends)] or [[]]
    ).astype(np.uint64) >> np.uint64(32)
    return ((high * np.uint64(num_shards)) >> np.uint64(32)).astype(np.int64)


class ShardIds(NamedTuple):
    """The ids that one shard owns of several tables' ids laid end to end.

    Attributes:
        positions: ascending positions into the joined ids.
        ids: the ids at those positions.
        bounds: ``positions[bounds[t]:bounds[t + 1]]`` belong to table ``t`` (one entry per
            table, and one more).
    """

    positions: np.ndarray
    ids: np.ndarray
    bounds: np.ndarray


def route_joined(
    tables: Sequence[str], ids: np.ndarray, ends: np.ndarray, num_shards: int
) -> list[ShardIds]:
    """Per shard (shard k's at index k), the ids it owns of ``ids``, where
    ``ids[ends[t-1]:ends[t]]`` belong to ``tables[t]``: routed in one pass, each shard's
    part of every table a slice of its arrays.

    Example:
        >>> part = route_joined(["user"], np.array([5, 9, 5]), np.array([3]), 2)[0]  # doctest: +SKIP
        >>> part.positions.tolist(), part.bounds.tolist()
        ([0, 2], [0, 2])
    """
    owners = shard_of_tables(tables, ids, ends, num_shards)
    routed = []
    for positions in positions_by_shard(owners, num_shards):
        bounds = np.concatenate([[0], np.searchsorted(positions, ends)]).astype(np.int64)
        routed.append(ShardIds(positions, ids[positions], bounds))
    return routed


def positions_by_shard(shards: np.ndarray, num_shards: int) -> list[np.ndarray]:
    """Indices into ``shards`` grouped by shard, each group in ascending order."""
    if num_shards == 1:
        return [np.arange(len(shards), dtype=np.int64)]
    return [np.flatnonzero(shards == k) for k in range(num_shards)]
