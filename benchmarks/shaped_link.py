"""A rate-limited link for benchmarks: a network namespace joined by a shaped veth pair.

The benchmark's servers run inside the namespace (``command_prefix``) and the
client stays outside; both directions of the veth pair are limited to the
same rate by ``tc`` HTB (netem and tbf are not available on every machine;
HTB is). The addresses come from the benchmarking range 198.18.0.0/15 and
exist only on the pair this module creates; everything is removed on exit.
Needs root and iproute2; :class:`LinkUnavailable` says why where it cannot be
made.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess
import sys
import time
from typing import Self

NAMESPACE_PREFIX = "ember-bench-"
_BENCH_RANGE = ipaddress.ip_network("198.18.0.0/15")
_SINK = """
import socket, sys
listener = socket.create_server((sys.argv[1], 0))
print(listener.getsockname()[1], flush=True)
listener.settimeout(20)
connection, _ = listener.accept()
connection.settimeout(20)
received = 0
while chunk := connection.recv(1 << 16):
    received += len(chunk)
print(received, flush=True)
"""


class LinkUnavailable(RuntimeError):
    """The shaped link cannot be made here (not root, no iproute2 or tc, ...)."""


class ShapedLink:
    """A namespace reached over a veth pair shaped to ``rate_mbit`` in each direction.

    Args:
        rate_mbit: the HTB rate (and ceiling) of both directions, in Mbit/s.

    Example:
        >>> with ShapedLink(50) as link:                          # doctest: +SKIP
        ...     subprocess.run([*link.command_prefix, "hostname", "-I"])
    """

    def __init__(self, rate_mbit: float) -> None:
        if not 0.1 <= rate_mbit <= 100_000:
            raise ValueError(f"rate_mbit must be in [0.1, 100000], got {rate_mbit}")
        self.rate_mbit = rate_mbit
        pid = os.getpid()
        self.namespace = f"{NAMESPACE_PREFIX}{pid}"
        self._host_device, self._peer_device = f"ebh{pid}", f"ebp{pid}"
        subnet = _BENCH_RANGE.network_address + 4 * (pid % (_BENCH_RANGE.num_addresses // 4))
        self.host_address, self.peer_address = str(subnet + 1), str(subnet + 2)

    @property
    def devices(self) -> tuple[str, str]:
        """The veth pair's interface names: the host's end, then the namespace's."""
        return self._host_device, self._peer_device

    @property
    def command_prefix(self) -> list[str]:
        """Run a command inside the namespace: prepend this."""
        return ["ip", "netns", "exec", self.namespace]

    def __enter__(self) -> Self:
        if os.geteuid() != 0:
            raise LinkUnavailable("network namespaces need root")
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                raise LinkUnavailable(f"{tool} (iproute2) is not installed")
        remove_stale_namespaces()
        rate = f"{self.rate_mbit}mbit"
        inside = self.command_prefix
        steps = [
            ["ip", "netns", "add", self.namespace],
            ["ip", "link", "add", self._host_device, "type", "veth",
             "peer", "name", self._peer_device],
            ["ip", "link", "set", self._peer_device, "netns", self.namespace],
            ["ip", "addr", "add", f"{self.host_address}/30", "dev", self._host_device],
            ["ip", "link", "set", self._host_device, "up"],
            [*inside, "ip", "addr", "add", f"{self.peer_address}/30", "dev", self._peer_device],
            [*inside, "ip", "link", "set", self._peer_device, "up"],
            [*inside, "ip", "link", "set", "lo", "up"],
        ]  # fmt: skip
        for prefix, device in (([], self._host_device), (inside, self._peer_device)):
            steps += [
                [*prefix, "tc", "qdisc", "add", "dev", device, "root", "handle", "1:",
                 "htb", "default", "10"],
                [*prefix, "tc", "class", "add", "dev", device, "parent", "1:", "classid",
                 "1:10", "htb", "rate", rate, "ceil", rate],
            ]  # fmt: skip
        try:
            for step in steps:
                _run(step)
        except BaseException:  # LinkUnavailable, or an interrupt half way
            self.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def remove(self) -> None:
        """Delete the namespace (which deletes the veth pair) and the host end if left over."""
        subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", self._host_device], capture_output=True, check=False)

    def measure_mbit(self, seconds: float = 1.5) -> float:
        """Throughput from this side into the namespace, in Mbit/s: one TCP stream, sent for
        at most ``seconds`` and at most what the configured rate could carry in twice that."""
        sink = subprocess.Popen(
            [*self.command_prefix, sys.executable, "-c", _SINK, self.peer_address],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            port = int(sink.stdout.readline())
            budget = int(self.rate_mbit * 1e6 / 8 * seconds * 2)
            chunk = bytes(1 << 16)
            sent, start = 0, time.perf_counter()
            with socket.create_connection((self.peer_address, port), timeout=20) as connection:
                while sent < budget and time.perf_counter() - start < seconds:
                    connection.sendall(chunk)
                    sent += len(chunk)
            received = int(sink.stdout.readline())
            elapsed = time.perf_counter() - start
        finally:
            sink.kill()
            sink.wait()
        return received * 8 / elapsed / 1e6


def remove_stale_namespaces() -> None:
    """Delete namespaces this module made in runs whose process is gone (a killed run)."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    for line in listing.stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if not name.startswith(NAMESPACE_PREFIX):
            continue
        pid = name.removeprefix(NAMESPACE_PREFIX)
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
            subprocess.run(["ip", "link", "del", f"ebh{pid}"], capture_output=True, check=False)


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise LinkUnavailable(f"`{' '.join(command)}` failed: {result.stderr.strip()}")
