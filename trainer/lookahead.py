"""Batches known ahead of their steps: a training loop's window over its batches, and the
plans that a row source or collection keeps for them until their step comes.

A pipelined row source fetches a step's rows while earlier steps compute, and
(exact mode, staleness <= 1) lets the lookup of step t ride on the update of
step t-2 (see :mod:`ember.trainer.pipeline`): it needs step t's ids two steps
early. The loop hands each batch to ``prefetch`` once, in step order, as soon
as it is within the source's ``lookahead`` (after step 0's rows, the next
``lookahead`` batches; after each later step's, one).

With ``background``, :meth:`Lookahead.announce` hands the batches to one
planning thread and returns: deduplicating a batch's ids and splitting them
among replicas and shards then runs on the host, on another core, while the
step's dense forward and backward run here (TorchRec's pipelines likewise start
the next batch's input work before this batch's backward). :meth:`Lookahead.settle`
waits for it, and the loop must call it before the step's update, which
carries the next steps' lookups: the training thread calls the collection and
its row source only outside ``announce``-``settle``. (The pipeline's own
lookup and update threads run then too; they share nothing with planning but
their locked counters.)
"""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Generic, TypeVar

Batch = TypeVar("Batch")
Planned = TypeVar("Planned")


class Lookahead(Generic[Batch]):
    """A training loop's batches, each announced to ``prefetch`` up to ``depth`` steps early.

    Args:
        batches: the training batches, in step order.
        depth: how many steps past the current one ``prefetch`` takes batches (>= 1).
        steps: the run's last step is ``steps - 1``: no batch past it is announced.
        prefetch: called once per batch, in order, before its step.
        background: call ``prefetch`` on a planning thread of its own (see the module
            docstring); use the lookahead as a context manager, or :meth:`close` it.

    Example:
        >>> ahead = Lookahead(batches, source.lookahead, steps, lambda b: ebc.prefetch(b.sparse))
        >>> while (batch := ahead.take()) is not None:          # doctest: +SKIP
        ...     pooled = ebc(batch.sparse)
        ...     ahead.announce()            # the next batches' rows come while this computes
        ...     loss_of(pooled).backward()
        ...     ahead.settle()              # with background: before the update carries them
        ...     ebc.step()
    """

    def __init__(
        self,
        batches: Iterator[Batch],
        depth: int,
        steps: int,
        prefetch: Callable[[Batch], None],
        background: bool = False,
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._batches, self._depth, self._steps = batches, depth, steps
        self._prefetch = prefetch
        self._planner = (
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ember-plan")
            if background
            else None
        )
        self._planning: concurrent.futures.Future | None = None
        self._ahead: collections.deque[Batch] = collections.deque()
        self._taken = 0  # steps whose batch take() gave
        self._announced = 0  # batches at the front of _ahead already given to prefetch

    def has_batch(self) -> bool:
        """Whether :meth:`take` has a batch to give."""
        self._fill()
        return bool(self._ahead)

    def take(self) -> Batch | None:
        """The next step's batch (None when the batches ran out), once the batches announced
        before it are planned."""
        self.settle()
        if not self.has_batch():
            return None
        self._taken += 1
        self._announced = max(0, self._announced - 1)
        return self._ahead.popleft()

    def announce(self) -> None:
        """Give ``prefetch`` the batches of the next ``depth`` steps it has not had yet (call
        after the current step's rows are read); with ``background``, on the planning thread,
        and :meth:`settle` waits for them."""
        self.settle()
        room = min(len(self._ahead), self._depth, self._steps - self._taken)
        upcoming = [self._ahead[index] for index in range(self._announced, room)]
        self._announced = max(self._announced, room)
        if self._planner is None:
            self._prefetch_each(upcoming)
        elif upcoming:
            self._planning = self._planner.submit(self._prefetch_each, upcoming)

    def settle(self) -> None:
        """Wait until the batches announced are given to ``prefetch``; raise what it raised
        (a batch counts as announced once handed over: a failed one is not planned again)."""
        planning, self._planning = self._planning, None
        if planning is not None:
            planning.result()

    def close(self) -> None:
        """Wait for the planning thread and stop it; an error of its planning is left for
        :meth:`settle` to raise."""
        if self._planner is not None:
            self._planner.shutdown(wait=True)

    def __enter__(self) -> Lookahead[Batch]:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Close; raise the planning's error where the block ended without one of its own,
        else note it on the block's."""
        self.close()
        try:
            self.settle()
        except Exception as planning:
            if error is None:
                raise
            error.add_note(f"(planning the next steps also failed: {planning!r})")

    def _prefetch_each(self, upcoming: list[Batch]) -> None:
        for batch in upcoming:
            self._prefetch(batch)

    def _fill(self) -> None:
        while len(self._ahead) < self._depth + 1:
            batch = next(self._batches, None)
            if batch is None:
                return
            self._ahead.append(batch)


def take_planned(
    planned: collections.deque[Planned], matches: Callable[[Planned], bool]
) -> Planned | None:
    """The oldest plan in ``planned`` that ``matches``, removed with every older one (plans
    of steps that were served without them); None, removing nothing, when none does."""
    for index, plan in enumerate(planned):
        if matches(plan):
            for _ in range(index + 1):
                planned.popleft()
            return plan
    return None
