"""A benchmark's headline figures, as the suite (``python -m benchmarks``) collects them:
ratios against a baseline measured in the same run, each with its target where there is one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class Figure:
    """One headline figure.

    Attributes:
        name: what it measures, naming its baseline.
        value: the measurement.
        target: the goal it is held to ('' : none), e.g. ``>= 1.5``.
        met: whether it met the target (None: no target).
    """

    name: str
    value: float
    target: str = ""
    met: bool | None = None


class Figures:
    """The headline figures of one benchmark run."""

    def __init__(self) -> None:
        self.items: list[Figure] = []

    def add(
        self, name: str, value: float, at_least: float | None = None, at_most: float | None = None
    ) -> None:
        """Record ``value``; with a bound, whether it met it."""
        target, met, value = "", None, float(value)  # numpy scalars are not JSON
        if at_least is not None:
            target, met = f">= {at_least:g}", value >= at_least
        elif at_most is not None:
            target, met = f"<= {at_most:g}", value <= at_most
        self.items.append(Figure(name, value, target, met))

    def write(self, path: Path | None, details: Any = None) -> None:
        """Write ``{"figures": [...], "details": details}`` as JSON to ``path`` (nothing when
        None); ``details`` holds the run's full measurements."""
        if path is not None:
            document = {"figures": [dataclasses.asdict(f) for f in self.items], "details": details}
            path.write_text(json.dumps(document, indent=2) + "\n")


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    """``--json PATH``: also write the headline figures there."""
    parser.add_argument(
        "--json", type=Path, default=None, help="also write the headline figures here"
    )
