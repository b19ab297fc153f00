"""The Prometheus endpoint of a shard or a trainer: ``/metrics`` over HTTP."""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server


class MetricsPortError(OSError):
    """The metrics port cannot be bound (taken, or not allowed)."""


class MetricsEndpoint:
    """Serves ``registry`` at ``http://host:port/metrics`` on a daemon thread until closed.

    Args:
        registry: what to expose.
        host: the address to bind.
        port: the port (0: a free one; :attr:`port` says which).

    Raises:
        MetricsPortError: the port is taken or cannot be bound, naming it.
    """

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        try:
            server, thread = start_http_server(port, addr=host, registry=registry)
        except OSError as error:
            raise MetricsPortError(
                f"cannot serve metrics on {host}:{port}: {error.strerror or error} (is the "
                "port taken? choose another with --metrics-port, or 0 for a free one)"
            ) from None
        self._server: WSGIServer = server
        self._thread: threading.Thread = thread
        self.port: int = server.server_port

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
