"""Timer: seconds spent inside ``with`` blocks, for the step's time accounting."""

from __future__ import annotations

import dataclasses
import time


@dataclasses.dataclass
class Timer:
    """Seconds spent inside ``with`` blocks of this timer (not reentrant)."""

    seconds: float = 0.0

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.seconds += time.perf_counter() - self._start
