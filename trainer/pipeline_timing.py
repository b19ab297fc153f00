"""Where a pipelined row source's time went: exposed and overlapped PS time, and served lags."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class PipelineTiming:
    """Seconds: ``exposed_wait`` blocked on the shards, ``ps_time`` the step RPCs took in all
    (exposed or overlapped), and the lag of every step's served clock.

    ``rows_to_update`` is the time from each step's rows being served to its
    ``apply_gradients`` (before that waits for room among the updates in flight): the
    compute that needs the rows, which no pipelining hides, since later lookups park until
    this update is applied. With several ranks it includes their all-reduces inside the
    step, and so waits for slower ranks."""

    exposed_wait: float = 0.0
    ps_time: float = 0.0
    rows_to_update: float = 0.0
    rows_to_update_steps: int = 0
    max_lag: int = 0
    lags: list[int] = dataclasses.field(default_factory=list)

    @property
    def overlapped(self) -> float:
        """PS time hidden behind compute."""
        return max(0.0, self.ps_time - self.exposed_wait)

    @property
    def rows_to_update_per_step(self) -> float:
        """Mean seconds from a step's rows to its update (0 before the first update)."""
        return self.rows_to_update / self.rows_to_update_steps if self.rows_to_update_steps else 0.0
