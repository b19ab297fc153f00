"""Row stores behind one interface, chosen per shard by URL (see :func:`open_store`)."""

from __future__ import annotations

import urllib.parse

from ember.ps_server.stores.base import RowBatch, RowStore
from ember.ps_server.stores.memory import InMemoryStore

__all__ = [
    "InMemoryStore",
    "RowBatch",
    "RowStore",
    "check_store_url",
    "clear_shard",
    "open_store",
    "probe_store",
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


def open_store(url: str, table: str, shard: int, dim: int, state_width: int) -> RowStore:
    """The store for one table on one shard.

    Args:
        url: ``memory`` (default); ``redis://[user:password@]host:port/db`` or
            ``rediss://`` (TLS); or ``tiered+redis://...?capacity=ROWS``: a
            memory tier of ROWS rows in front of that Redis.

    Raises:
        ValueError: an unknown scheme or a malformed URL.
        StoreUnavailableError: the Redis server does not answer or refuses the credentials.
    """
    check_store_url(url)
    if url in ("", "memory"):
        return InMemoryStore(dim, state_width)
    from ember.ps_server.stores.redis_store import RedisStore

    if not url.startswith(_TIERED):
        return RedisStore(url, table, shard, dim, state_width)
    from ember.ps_server.stores.tiered import TieredStore

    redis_url, capacity = _split_capacity(url.removeprefix(_TIERED))
    return TieredStore(RedisStore(redis_url, table, shard, dim, state_width), capacity)


def clear_shard(url: str, shard: int) -> int:
    """Delete every row of ``shard`` that the store at ``url`` keeps outside this process."""
    if url in ("", "memory"):
        return 0
    from ember.ps_server.stores.redis_store import clear_shard_rows

    redis_url = url.removeprefix(_TIERED)
    if url.startswith(_TIERED):
        redis_url = _split_capacity(redis_url)[0]
    return clear_shard_rows(redis_url, shard)


def probe_store(url: str) -> None:
    """Check at start-up that the store at ``url`` answers (Redis: connects, authenticates, pings).

    Raises:
        ValueError: a malformed URL.
        StoreUnavailableError: the server does not answer or refuses the credentials.
    """
    if url not in ("", "memory"):
        open_store(url, "_probe", 0, 1, 0)


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
