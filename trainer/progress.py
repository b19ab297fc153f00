"""The live progress line of rank 0: a tqdm bar on a terminal, a plain line now and then
in a log."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from tqdm import tqdm


def describe(snapshot: dict[str, Any]) -> str:
    """The figures a user watches, with readable numbers."""
    parts = [
        f"loss {snapshot['loss']:.4f}",
        f"{tqdm.format_sizeof(snapshot['samples_per_s'], divisor=1000)} samples/s",
        f"PS wait {snapshot['ps_wait_share']:.0%}",
    ]
    if snapshot["overlapped_share"]:
        parts.append(f"PS overlapped {snapshot['overlapped_share']:.0%}")
    if snapshot["hit_rate"]:
        parts.append(f"hot hits {snapshot['hit_rate']:.0%}")
    parts.append(f"{sum(snapshot['bytes_per_sample'].values()):,.0f} B/sample")
    if snapshot["clock_lag"]:
        parts.append(f"clock lag {snapshot['clock_lag']}")
    return " | ".join(parts)


class ProgressLine:
    """Shows each step's figures: redrawn in place on a terminal, a line per ``every`` steps
    (and the last) otherwise."""

    def __init__(self, total: int, stream: TextIO = sys.stderr, every: int = 25) -> None:
        self.total, self.stream, self.every = total, stream, every
        self._bar = (
            tqdm(total=total, unit="step", file=stream, dynamic_ncols=True, mininterval=0.2)
            if stream.isatty()
            else None
        )

    def update(self, snapshot: dict[str, Any]) -> None:
        """Show the figures after ``snapshot['step']`` steps."""
        step = snapshot["step"]
        if self._bar is not None:
            self._bar.set_postfix_str(describe(snapshot), refresh=False)
            self._bar.update(step - self._bar.n)
        elif step % self.every == 0 or step == self.total:
            self.stream.write(f"step {step}/{self.total}  {describe(snapshot)}\n")
            self.stream.flush()

    def close(self) -> None:
        """End the bar (a terminal keeps its last state)."""
        if self._bar is not None:
            self._bar.close()
