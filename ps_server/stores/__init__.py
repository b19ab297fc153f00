"""Row stores behind one interface, chosen per shard by URL (see :func:`open_store`)."""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING

from ember.ps_server.stores.base import RowBatch, RowStore
from ember.ps_server.stores.memory import InMemoryStore

if TYPE_CHECKING:
    from ember.ps_server.durability.shard_fault import ShardFault
    from ember.ps_server.stores.redis_marker import RedisShardMarker

__all__ = [
    "InMemoryStore",
    "RowBatch",
    "RowStore",
    "check_store_url",
    "clear_shard",
    "open_marker",
    "open_store",
]

_TIERED = "tiered+"


def check_store_url(url: str) -> None:
    """Raise ValueError (password redacted) unless ``url`` names a store :func:`open_store` knows."""
    redis_url = url.removeprefix(_TIERED)
    if url in ("", "memory"):
        return
    if not redis_url.startswith(("redis://", "rediss://")):
        raise ValueError(
            "store must be 'memory', redis://..., rediss://... or tiered+redis://...?capacity=ROWS, "
            f"got {url.split('@')[-1]!r}"
        )
    if url.startswith(_TIERED):
        _split_capacity(redis_url)


def open_store(
    url: str,
    table: str,
    shard: int,
    dim: int,
    state_width: int,
    marker: RedisShardMarker | None = None,
) -> RowStore:
    """The store for one table on one shard.

    Args:
        url: ``memory`` (default); ``redis://[user:password@]host:port/db`` or
            ``rediss://`` (TLS); or ``tiered+redis://...?capacity=ROWS``: a
            memory tier of ROWS rows in front of that Redis.
        marker: the shard's marker in that Redis (see :func:`open_marker`).

    Raises:
        ValueError: an unknown scheme or a malformed URL.
        StoreUnavailableError: the Redis server does not answer or refuses the credentials.
    """
    check_store_url(url)
    if url in ("", "memory"):
        return InMemoryStore(dim, state_width)
    from ember.ps_server.stores.redis_store import RedisStore

    redis_url, capacity = _redis_url(url)
    cold = RedisStore(redis_url, table, shard, dim, state_width, marker=marker)
    if capacity is None:
        return cold
    from ember.ps_server.stores.tiered import TieredStore

    return TieredStore(cold, capacity)


def open_marker(
    url: str, shard: int, num_shards: int, fault: ShardFault, accept_empty: bool = False
) -> RedisShardMarker | None:
    """The shard's marker in the Redis behind ``url`` (None for the memory store).

    See :class:`ember.ps_server.stores.redis_marker.RedisShardMarker`.
    """
    check_store_url(url)
    if url in ("", "memory"):
        return None
    from ember.ps_server.stores.redis_connection import connect, redact
    from ember.ps_server.stores.redis_marker import RedisShardMarker

    redis_url = _redis_url(url)[0]
    return RedisShardMarker(
        connect(redis_url), redact(redis_url), shard, num_shards, fault, accept_empty
    )


def clear_shard(url: str, shard: int, marker: RedisShardMarker | None = None) -> int:
    """Delete every row of ``shard`` that the store at ``url`` keeps outside this process
    (with the shard's ``marker``: only while this process's epoch of it holds)."""
    if url in ("", "memory"):
        return 0
    from ember.ps_server.stores.redis_store import clear_shard_rows

    return clear_shard_rows(_redis_url(url)[0], shard, marker)


def _redis_url(url: str) -> tuple[str, int | None]:
    """The Redis URL behind a redis or tiered store URL, and the tier's capacity (None: untiered)."""
    if url.startswith(_TIERED):
        return _split_capacity(url.removeprefix(_TIERED))
    return url, None


def _split_capacity(redis_url: str) -> tuple[str, int]:
    """The Redis URL without its ``capacity`` query parameter, and that capacity."""
    parts = urllib.parse.urlsplit(redis_url)
    query = urllib.parse.parse_qs(parts.query)
    values = query.pop("capacity", [])
    if len(values) != 1 or not values[0].isdigit() or int(values[0]) < 1:
        raise ValueError(
            "a tiered store needs ?capacity=ROWS (a positive integer) on its URL, "
            f"got {redis_url.split('@')[-1]!r}"
        )
    rest = urllib.parse.urlencode(query, doseq=True)
    return urllib.parse.urlunsplit(parts._replace(query=rest)), int(values[0])
