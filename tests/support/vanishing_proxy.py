"""VanishingProxy: a loopback TCP proxy that can make the host behind it vanish.

Until :meth:`VanishingProxy.vanish`, bytes flow both ways. After it, every
connection through the proxy goes silent in both directions, and neither side
learns that the other closed: each side sees what it would see if the other's
host lost power, with no FIN or RST ever arriving. Only keepalive can notice.
"""

from __future__ import annotations

import socket
import threading
from typing import Self


class VanishingProxy:
    """Forwards ``127.0.0.1:port`` to ``upstream`` (``host:port``) until :meth:`vanish`.

    Use as a context manager; leaving it closes every socket it made.
    """

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self._upstream = (host, int(port))
        self._vanished = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def vanish(self) -> None:
        """From now on nothing passes, in either direction, and no close is passed on."""
        self._vanished.set()

    def close(self) -> None:
        """Close the listener and every connection."""
        with self._lock:
            sockets, self._sockets = [self._listener, *self._sockets], []
        for sock in sockets:
            sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self._listener.accept()
            except OSError:  # closed
                return
            upstream = socket.create_connection(self._upstream)
            with self._lock:
                self._sockets += [downstream, upstream]
            for source, target in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        while True:
            try:
                data = source.recv(1 << 16)
            except OSError:  # closed by close()
                return
            if self._vanished.is_set():
                if not data:
                    return  # the other side never hears of it
                continue  # dropped, as by a dead host
            try:
                if not data:
                    target.shutdown(socket.SHUT_WR)
                    return
                target.sendall(data)
            except OSError:
                return
