"""gRPC keepalive, agreed between clients and shards.

Without it, a peer whose host vanishes (power loss, a cable pulled, a
partition) is noticed only when TCP gives up, which can take many minutes:
a trainer waits on a shard that is gone, and a shard holds the wait slot,
worker thread and buffered update of a trainer that is gone. With it, each
side pings the other every ``keepalive_s`` while calls are in flight and
drops the connection when a ping is not answered within ``keepalive_s`` (at
least :data:`MIN_PING_TIMEOUT_S`, so that a busy host is not taken for a
dead one): the client's calls fail UNAVAILABLE (retried), the shard's waits
end as for a caller that went away. A shard accepts pings twice as often as
the most frequent setting allows, so any client setting is accepted. (A
shard older than this accepts a ping only every 5 minutes and drops a client
that pings more: upgrade shards before clients.)
"""

from __future__ import annotations

DEFAULT_KEEPALIVE_S = 20.0
MIN_KEEPALIVE_S = 1.0
MAX_KEEPALIVE_S = 86_400.0
MIN_PING_TIMEOUT_S = 5.0


def check_keepalive(keepalive_s: float) -> None:
    """Raise ValueError unless ``keepalive_s`` is in [MIN_KEEPALIVE_S, MAX_KEEPALIVE_S]."""
    if not MIN_KEEPALIVE_S <= keepalive_s <= MAX_KEEPALIVE_S:
        raise ValueError(
            f"keepalive_s must be in {MIN_KEEPALIVE_S}..{MAX_KEEPALIVE_S}, got {keepalive_s}"
        )


def keepalive_options(keepalive_s: float, server: bool) -> list[tuple[str, int]]:
    """gRPC channel (``server`` False) or server options that ping the peer every
    ``keepalive_s`` while calls are in flight and drop it when a ping goes unanswered (see
    the module docstring); a server's also accept its clients' pings."""
    check_keepalive(keepalive_s)
    timeout_ms = int(max(keepalive_s, MIN_PING_TIMEOUT_S) * 1000)
    options = [
        ("grpc.keepalive_time_ms", int(keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", timeout_ms),
        ("grpc.http2.ping_timeout_ms", timeout_ms),  # what gRPC core enforces: grpc/grpc#39239
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.max_pings_without_data", 0),  # a held call sends no data: ping anyway
    ]
    if server:
        accepted_ms = int(MIN_KEEPALIVE_S * 1000) // 2
        options.append(("grpc.http2.min_ping_interval_without_data_ms", accepted_ms))
    return options
