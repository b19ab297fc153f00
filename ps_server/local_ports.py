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


def restartable_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now, chosen at random below the kernel's ephemeral range
    (where no connection or port-0 bind is given it); from that range where the range
    leaves no room below it (then a restart may find the port taken)."""
    below = _ephemeral_start()
    if below - LOWEST_PORT >= 1_000:
        chooser = random.SystemRandom()
        for _ in range(_TRIES):
            port = chooser.randrange(LOWEST_PORT, below)
            if _bindable(host, port):
                return port
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (0 where it cannot be read)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True
