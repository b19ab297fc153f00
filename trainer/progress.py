"""A one-line live progress display for training on rank 0."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    """Redraws one line in place on a terminal; prints a line per ``every`` steps otherwise."""

    def __init__(
        self, total: int, stream: TextIO = sys.stderr, every: int = 25, width: int = 24
    ) -> None:
        self.total = total
        self.stream = stream
        self.every = every
        self.width = width
        self._interactive = stream.isatty()
        self._last_draw = 0.0

    def update(self, step: int, **fields: float) -> None:
        """Show ``step`` of ``total`` and the given figures (``name=value``)."""
        now = time.monotonic()
        last = step == self.total
        if self._interactive and not last and now - self._last_draw < 0.1:
            return
        if not self._interactive and not last and step % self.every:
            return
        self._last_draw = now
        filled = int(self.width * step / max(1, self.total))
        bar = "#" * filled + "." * (self.width - filled)
        text = "  ".join(f"{name} {value:,.4g}" for name, value in fields.items())
        line = f"[{bar}] step {step}/{self.total}  {text}"
        if self._interactive:
            self.stream.write("\r" + line + ("\n" if last else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
