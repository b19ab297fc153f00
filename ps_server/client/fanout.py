"""Concurrent blocking gRPC calls on a persistent thread pool.

grpc's ``.future()`` starts a thread per call to drive the channel; a pool of
long-lived threads making blocking calls (which release the GIL while they
wait) avoids that cost on every request. A single call runs inline.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Self

Outcome = tuple[Any, BaseException | None]


class FanOutClosedError(RuntimeError):
    """The fan-out was closed before a call could start."""


class FanOut:
    """Runs zero-argument callables concurrently and returns their outcomes in order.

    The pool starts threads as calls need them, up to ``max_workers``, and keeps them.

    Args:
        max_workers: most calls running at once; more wait for a thread.

    Example:
        >>> with FanOut(4) as fan_out:
        ...     fan_out.run([lambda: 1, lambda: 2])
        [(1, None), (2, None)]
    """

    def __init__(self, max_workers: int) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="ember-fanout"
        )
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, calls: Sequence[Callable[[], Any]]) -> list[Outcome]:
        """``(result, None)`` or ``(None, exception)`` for every call, in order."""
        outcomes: list[Outcome] = [(None, None)] * len(calls)
        for index, outcome in self.as_completed(calls):
            outcomes[index] = outcome
        return outcomes

    def as_completed(self, calls: Sequence[Callable[[], Any]]) -> Iterator[tuple[int, Outcome]]:
        """``(index, outcome)`` of every call as it finishes, so results can be
        consumed while other calls are still in flight. A call that :meth:`close`
        kept from starting has a :class:`FanOutClosedError` as its outcome."""
        if len(calls) == 1:
            yield 0, _closed_outcome() if self._closed else _outcome(calls[0])
            return
        # A done-callback also runs when close() cancels a queued call, which
        # concurrent.futures.as_completed is not woken by (CPython gh-87893).
        finished: queue.SimpleQueue[concurrent.futures.Future] = queue.SimpleQueue()
        futures = {}
        for index, call in enumerate(calls):
            future = self._submit(call)
            futures[future] = index
            future.add_done_callback(finished.put)
        for _ in futures:
            future = finished.get()
            yield futures[future], _closed_outcome() if future.cancelled() else future.result()

    def close(self) -> None:
        """Stop the pool's threads: calls not yet started end with FanOutClosedError at
        once (calls already running finish first), and later calls are refused."""
        with self._lock:
            self._closed = True
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _submit(self, call: Callable[[], Any]) -> concurrent.futures.Future:
        with self._lock:
            if not self._closed:
                try:
                    return self._pool.submit(_outcome, call)
                except RuntimeError as error:  # no thread could be started
                    return _done((None, error))
        return _done(_closed_outcome())


def _outcome(call: Callable[[], Any]) -> Outcome:
    try:
        return call(), None
    except Exception as error:  # noqa: BLE001 - handed back to the caller
        return None, error


def _closed_outcome() -> Outcome:
    return None, FanOutClosedError("the fan-out was closed before this call could start")


def _done(outcome: Outcome) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_result(outcome)
    return future
