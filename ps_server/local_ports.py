"""Free TCP ports that a process restarted on them finds free again.

The kernel hands out ports from its ephemeral range to outgoing connections and
to binds of port 0. A server killed and started again on a port from that range
may find it taken in between by any process's connection, so local clusters
take their ports below it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# The lowest port chosen: below it lie the well-known ports and many services' defaults.
LOWEST_PORT = 10_000
_TRIES = 100


def restartable_port(host: str = "127.0.0.1", taken: frozenset[int] = frozenset()) -> int:
    """A TCP port free on ``host`` now and not in ``taken``, chosen at random below the
    kernel's ephemeral range (where no connection or port-0 bind is given it); 0 where the
    range leaves no room below it or ``host`` cannot be bound from here (an address of
    another network namespace): the server then binds port 0 itself, and a restart may
    find its port taken."""
    below = _ephemeral_start()
    if below - LOWEST_PORT < 1_000:
        return 0
    chooser = random.SystemRandom()
    for _ in range(_TRIES):
        port = chooser.randrange(LOWEST_PORT, below)
        if port not in taken and _bindable(host, port):
            return port
    return 0


def any_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now: a restartable one where there is one, else one the
    kernel picks."""
    port = restartable_port(host)
    if port:
        return port
    with _listening(host, 0) as probe:
        return probe.getsockname()[1]


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (0 where it cannot be read)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _bindable(host: str, port: int) -> bool:
    try:
        with _listening(host, port):
            return True
    except OSError:  # taken, or an address this namespace does not have
        return False


def _listening(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` (IPv4 or IPv6 as ``host`` resolves), with
    SO_REUSEADDR as servers bind."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    return socket.create_server((host, port), family=family)
