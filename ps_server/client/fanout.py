"""Concurrent blocking gRPC calls on a persistent thread pool.

grpc's ``.future()`` starts a thread per call to drive the channel; a pool of
long-lived threads making blocking calls (which release the GIL while they
wait) avoids that cost on every request. A single call runs inline.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Self

Outcome = tuple[Any, BaseException | None]


class FanOut:
    """Runs zero-argument callables concurrently and returns their outcomes in order.

    Args:
        max_workers: threads in the pool.

    Example:
        >>> with FanOut(4) as fan_out:
        ...     fan_out.run([lambda: 1, lambda: 2])
        [(1, None), (2, None)]
    """

    def __init__(self, max_workers: int) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="ember-fanout"
        )

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
        consumed while other calls are still in flight."""
        if len(calls) == 1:
            yield 0, _outcome(calls[0])
            return
        futures = {self._pool.submit(_outcome, call): index for index, call in enumerate(calls)}
        for future in concurrent.futures.as_completed(futures):
            yield futures[future], future.result()

    def close(self) -> None:
        """Stop the pool's threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _outcome(call: Callable[[], Any]) -> Outcome:
    try:
        return call(), None
    except Exception as error:  # noqa: BLE001 - handed back to the caller
        return None, error
