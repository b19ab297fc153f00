"""Row stores behind one interface, chosen per shard by URL (see :func:`open_store`)."""

from __future__ import annotations

from ember.ps_server.stores.base import RowBatch, RowStore
from ember.ps_server.stores.memory import InMemoryStore

__all__ = ["InMemoryStore", "RowBatch", "RowStore", "open_store", "probe_store"]


def open_store(url: str, table: str, shard: int, dim: int, state_width: int) -> RowStore:
    """The store for one table on one shard.

    Args:
        url: ``memory`` (default) or ``redis://[user:password@]host:port/db`` / ``rediss://``.

    Raises:
        ValueError: an unknown scheme or a malformed URL.
        StoreUnavailableError: the Redis server does not answer or refuses the credentials.
    """
    if url in ("", "memory"):
        return InMemoryStore(dim, state_width)
    if url.startswith(("redis://", "rediss://")):
        from ember.ps_server.stores.redis_store import RedisStore

        return RedisStore(url, table, shard, dim, state_width)
    raise ValueError(
        f"store URL must be 'memory', redis://... or rediss://..., got {url.split('@')[-1]!r}"
    )


def probe_store(url: str) -> None:
    """Check at start-up that the store at ``url`` answers (Redis: connects, authenticates, pings).

    Raises:
        ValueError: a malformed URL.
        StoreUnavailableError: the server does not answer or refuses the credentials.
    """
    if url not in ("", "memory"):
        open_store(url, "_probe", 0, 1, 0)
