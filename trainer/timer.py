"""Timer: seconds spent inside ``with`` blocks, for the step's time accounting."""

from __future__ import annotations

import dataclasses
import time


@dataclasses.dataclass
class Timer:
    """Seconds spent inside ``with`` blocks of this timer (one at a time: a block opened
    inside another would count its time twice, so it raises RuntimeError)."""

    seconds: float = 0.0
    _start: float | None = None

    def __enter__(self) -> None:
        if self._start is not None:
            raise RuntimeError("this timer's block is already open (timers do not nest)")
        self._start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        assert self._start is not None
        self.seconds += time.perf_counter() - self._start
        self._start = None
