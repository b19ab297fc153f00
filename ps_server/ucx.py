"""UCX's Python binding, loaded on demand, and the one event loop a process runs it on.

ucx-py (``ucp``) is used where it is installed, else its successor ``ucxx``;
both offer a listener, endpoints and tag send/receive (:func:`endpoint_closed`
bridges the one difference Ember meets). Neither is a dependency of Ember:
``pip install 'ember-ps[ucx]'`` adds ``ucxx``. Only ``ucxx`` is tested here.

Completions reach Python as futures set by the binding's notifier thread
(``UCXPY_ENABLE_PYTHON_FUTURE``); without them every pending receive polls
the event loop, and an idle connection costs a whole core. The notifier binds
to the first loop that uses UCX, so a process has one such loop:
:func:`ucx_loop`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import os
import threading
from collections.abc import Coroutine
from types import ModuleType
from typing import Any, TypeVar

T = TypeVar("T")

_BINDINGS = ("ucp", "ucxx")
_ENVIRONMENT = {
    # UCX warns about every UCX_* variable it does not know; the bindings set some of their own.
    "UCX_WARN_UNUSED_ENV_VARS": "n",
    "UCXPY_ENABLE_PYTHON_FUTURE": "1",
}
# Over TCP alone (UCX_TLS exactly "tcp"), UCX's default rendezvous costs ~20 ms of CPU on
# each side for a 16 MiB message over loopback, the rendezvous by put ~7 ms (tcp offers put,
# not get; benchmarks/RESULTS.md, session 32), and a peer on the default scheme still works
# with it. Only then: a forced scheme demotes every other rendezvous protocol, the staged
# copies of device memory (cuda_copy) included. Larger TCP segments (UCX_TCP_*_SEG_SIZE)
# measured as fast, but a peer whose segments are smaller crashes on the first large message.
_TCP_ONLY_ENVIRONMENT = {"UCX_RNDV_SCHEME": "put_zcopy"}
_loop: LoopThread | None = None
_loop_lock = threading.Lock()


class UcxUnavailableError(RuntimeError):
    """No UCX binding can be imported, or UCX cannot listen or connect as asked."""


def load_ucx() -> ModuleType:
    """The first UCX binding that imports (``ucp``, then ``ucxx``), with Ember's defaults
    for UCX's environment where it sets none (read when UCX starts, so set before).

    Raises:
        UcxUnavailableError: neither imports; the message says what to install.
    """
    tcp_only = os.environ.get("UCX_TLS", "").strip().lower() == "tcp"
    for name, value in {**_ENVIRONMENT, **(_TCP_ONLY_ENVIRONMENT if tcp_only else {})}.items():
        os.environ.setdefault(name, value)
    failures = []
    for name in _BINDINGS:
        try:
            return importlib.import_module(name)
        except ImportError as error:
            failures.append(f"{name}: {error}")
        except Exception as error:  # noqa: BLE001 - a binding that breaks on import
            failures.append(f"{name}: {type(error).__name__}: {error}")
    raise UcxUnavailableError(
        "the UCX transport needs ucx-py (ucp) or ucxx; install it with "
        f"pip install 'ember-ps[ucx]' ({'; '.join(failures)})"
    )


def ucx_missing() -> str:
    """Why no UCX binding loads here ('' when one does)."""
    try:
        load_ucx()
    except UcxUnavailableError as error:
        return str(error)
    return ""


def ucx_errors(ucx: ModuleType) -> tuple[type[BaseException], ...]:
    """The exception classes ``ucx`` raises for a failed transfer or a lost peer."""
    exceptions = ucx.exceptions
    names = ("UCXBaseException", "UCXError", "UCXCanceled", "UCXCloseError")
    return tuple({getattr(exceptions, n) for n in names if hasattr(exceptions, n)})


def endpoint_closed(endpoint: Any) -> bool:
    """Whether ``endpoint`` is closed (a property in ucxx, a method in ucx-py)."""
    closed = endpoint.closed
    return bool(closed() if callable(closed) else closed)


async def close_endpoint(endpoint: Any, errors: tuple[type[BaseException], ...]) -> None:
    """Close ``endpoint``, ignoring a peer that is already gone."""
    if endpoint is None:
        return
    try:
        await endpoint.close()
    except errors:
        pass


def ucx_loop() -> LoopThread:
    """The process's event loop for UCX, started on first use; it lives as long as the process."""
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = LoopThread("ember-ucx")
        return _loop


class LoopThread:
    """An asyncio event loop on a daemon thread, for UCX calls from ordinary threads.

    Args:
        name: the thread's name.
    """

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coroutine`` on the loop; its future (cancelling it cancels the coroutine)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop; block until it returns or raises.

        Raises:
            RuntimeError: called on the loop's own thread (it would wait for itself).
        """
        try:
            self.check_not_on_loop("a UCX call")
        except RuntimeError:
            coroutine.close()
            raise
        return self.submit(coroutine).result()

    def check_not_on_loop(self, what: str) -> None:
        """Raise RuntimeError on the loop's own thread, where waiting for the loop would
        wait forever."""
        if threading.current_thread() is self._thread:
            raise RuntimeError(
                f"{what} blocked the UCX event loop's own thread; call it from another thread"
            )
