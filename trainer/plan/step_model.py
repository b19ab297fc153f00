"""How long a pipelined step takes, from its traffic and a machine's calibrated figures.

The step pipeline overlaps a step's compute with the next step's lookup and
its own update. Two things bound a step:

* the CPU work of the step, with the shards' share of it (on one machine they
  compete for the same cores): a line in the step's cold rows, fitted from
  short calibration runs on a fast network, one line per staleness regime
  (``s = 0`` exposes each update's round trip; ``s >= 1`` hides it);
* the link: lookups stream rows down while updates stream gradients up, so
  with ``s >= 1`` a step needs ``max(bytes up, bytes down) / bandwidth``;
  with ``s = 0`` the next lookup still overlaps compute, but the update's
  upload and its collision rows' download are exposed, with a round trip.

A third bound is the chain that staleness allows to overlap: the lookup of step
``t`` parks on the shard until the update of step ``t-1-s`` is applied, so
between the end of step ``t-1-s`` and the end of step ``t`` lie that update's
upload, the lookup's download, a round trip and the part of step ``t``'s
compute that needs its rows (from the rows being served to the update being
sent; the next batch's generation overlaps the wait). Those ``s + 1`` steps
take about ``(chain cpu + wire(up + down) + rtt) / (s + 1)`` each. Where CPU and
link take about as long, this chain, not either alone, sets the pace. The
update's encoding and the shards' apply and serving lie on the chain too, but
are left out: they run on other threads and processes, and their durations
measured on loopback, where they compete with the trainer for the cores,
over-predicted the shaped runs by up to 33% (benchmarks/RESULTS.md).

The step takes the largest bound (``s >= 1``), or the CPU-bound step plus the
exposed update (``s = 0``: there the chain is the exposed update itself). With several ranks the hot rows' gradients are
all-reduced inside every step (a ring moves ``2 (W-1)/W`` of their bytes per
rank); their wire time is added, on the same link (their CPU cost is not
calibrated: calibration runs one process). So are the hot rows' write-backs,
amortised per step (training waits for them): their wire time and their
calibrated CPU time per row. The CPU lines are fitted to steps without the
run's last write-back, which is priced by that per-row figure instead.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from ember.trainer.plan.traffic_model import ID_BYTES, Traffic


@dataclasses.dataclass(frozen=True)
class CostLine:
    """Seconds per step as ``base_s + per_cold_row_s * cold rows``."""

    base_s: float
    per_cold_row_s: float

    def at(self, cold_rows: float) -> float:
        """The line's seconds at ``cold_rows``."""
        return self.base_s + self.per_cold_row_s * cold_rows

    @classmethod
    def from_json(cls, table: dict) -> CostLine:
        """A line from its fields' form (``dataclasses.asdict``)."""
        return cls(float(table["base_s"]), float(table["per_cold_row_s"]))

    @classmethod
    def fit(cls, cold_rows: Sequence[float], seconds: Sequence[float]) -> CostLine:
        """The least-squares line through measured ``(cold rows, seconds per step)`` pairs,
        base and slope kept >= 0 (one pair, or pairs at one cold-row count: a flat line at
        their mean)."""
        if len(cold_rows) != len(seconds) or not len(seconds):
            raise ValueError("a cost line needs matching, non-empty cold rows and seconds")
        x, y = np.asarray(cold_rows, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
        if len(x) == 1 or np.ptp(x) == 0:
            return cls(float(y.mean()), 0.0)
        slope, base = np.polyfit(x, y, 1)
        if base < 0:
            return cls(0.0, float((x @ y) / (x @ x)))
        if slope < 0:
            return cls(float(y.mean()), 0.0)
        return cls(float(base), float(slope))


@dataclasses.dataclass(frozen=True)
class MachineFigures:
    """What a step costs on one machine and link.

    Attributes:
        cpu_exact: CPU-bound step time with staleness 0, by cold rows.
        cpu_stale: CPU-bound step time with staleness >= 1, by cold rows.
        bandwidth_mbit: the link's rate each way (None: as fast as the calibration's).
        rtt_ms: the link's round trip beyond the calibration's.
        control_bytes_per_step: step messages' framing, measured by the calibration.
        writeback_s_per_row: CPU seconds per hot row written back (measured by the
            calibration; training waits for write-backs).
        cpu_chain: with staleness >= 1, the compute from a step's rows to its update, by
            cold rows (None: the whole CPU-bound step, an upper bound).
    """

    cpu_exact: CostLine
    cpu_stale: CostLine
    bandwidth_mbit: float | None = None
    rtt_ms: float = 0.0
    control_bytes_per_step: float = 0.0
    writeback_s_per_row: float = 0.0
    cpu_chain: CostLine | None = None

    def __post_init__(self) -> None:
        lines = (self.cpu_exact, self.cpu_stale, self.cpu_chain)
        for line in (line for line in lines if line is not None):
            values = (line.base_s, line.per_cold_row_s)
            if not all(math.isfinite(v) and v >= 0 for v in values) or not any(values):
                raise ValueError(
                    f"cost lines need a finite base and slope >= 0, not both 0; got {line}"
                )
        if not (math.isfinite(self.writeback_s_per_row) and self.writeback_s_per_row >= 0):
            raise ValueError(
                f"writeback_s_per_row must be finite and >= 0, got {self.writeback_s_per_row}"
            )
        if not (math.isfinite(self.control_bytes_per_step) and self.control_bytes_per_step >= 0):
            raise ValueError(
                f"control_bytes_per_step must be finite and >= 0, got {self.control_bytes_per_step}"
            )
        if self.bandwidth_mbit is not None and not (
            math.isfinite(self.bandwidth_mbit) and self.bandwidth_mbit > 0
        ):
            raise ValueError(f"bandwidth_mbit must be > 0, got {self.bandwidth_mbit}")
        if not (math.isfinite(self.rtt_ms) and self.rtt_ms >= 0):
            raise ValueError(f"rtt_ms must be >= 0, got {self.rtt_ms}")

    def to_json(self) -> dict:
        """The figures as a plan file stores them."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, table: dict) -> MachineFigures:
        """Figures from :meth:`to_json`'s form; ValueError naming what is missing or wrong."""
        try:
            lines = {name: CostLine.from_json(table[name]) for name in ("cpu_exact", "cpu_stale")}
            chain, bandwidth = table.get("cpu_chain"), table.get("bandwidth_mbit")
            return cls(
                **lines,
                cpu_chain=None if chain is None else CostLine.from_json(chain),
                bandwidth_mbit=None if bandwidth is None else float(bandwidth),
                rtt_ms=float(table.get("rtt_ms", 0.0)),
                control_bytes_per_step=float(table.get("control_bytes_per_step", 0.0)),
                writeback_s_per_row=float(table.get("writeback_s_per_row", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"machine figures: missing or malformed field ({error})") from None

    def on_link(self, bandwidth_mbit: float | None, rtt_ms: float = 0.0) -> MachineFigures:
        """These CPU figures behind another link."""
        return dataclasses.replace(self, bandwidth_mbit=bandwidth_mbit, rtt_ms=rtt_ms)

    def wire_seconds(self, nbytes: float) -> float:
        """Seconds ``nbytes`` take on the link (0 without a bandwidth)."""
        if self.bandwidth_mbit is None:
            return 0.0
        return nbytes * 8 / (self.bandwidth_mbit * 1e6)


@dataclasses.dataclass(frozen=True)
class StepTime:
    """A step's predicted seconds and what bounds it."""

    seconds: float
    cpu_s: float
    link_s: float
    chain_s: float = 0.0

    @property
    def bound(self) -> str:
        """``cpu``, ``link`` or ``chain`` (update then parked lookup): the largest bound."""
        bounds = {"cpu": self.cpu_s, "link": self.link_s, "chain": self.chain_s}
        return max(bounds, key=bounds.__getitem__)


def step_time(
    traffic: Traffic, staleness: int, figures: MachineFigures, ranks: int = 1
) -> StepTime:
    """The predicted step time of ``traffic`` under ``staleness`` with ``ranks`` ranks."""
    rtt = figures.rtt_ms / 1000
    blocking = (
        figures.wire_seconds(  # inside the step: training waits for these
            2 * (ranks - 1) / ranks * traffic.bytes_hot_allreduce + traffic.bytes_writeback
        )
        + figures.writeback_s_per_row * traffic.writeback_rows
    )
    if staleness >= 1:
        cpu = figures.cpu_stale.at(traffic.cold_rows)
        link = figures.wire_seconds(max(traffic.bytes_up, traffic.bytes_down)) + rtt
        wire_both_ways = figures.wire_seconds(traffic.bytes_up + traffic.bytes_down)
        on_chain = cpu if figures.cpu_chain is None else figures.cpu_chain.at(traffic.cold_rows)
        on_chain = min(on_chain, cpu)  # a part of the step's compute, fitted on its own
        chain = (on_chain + wire_both_ways + rtt) / (staleness + 1)
        return StepTime(max(cpu, link, chain) + blocking, cpu, link + blocking, chain + blocking)
    cpu = figures.cpu_exact.at(traffic.cold_rows)
    collisions_down = traffic.collision_rows * (ID_BYTES + traffic.row_bytes)
    lookup_down = traffic.bytes_down - collisions_down
    update_up = traffic.bytes_up - ID_BYTES * traffic.cold_rows  # all but the lookup's ids
    exposed = figures.wire_seconds(update_up + collisions_down) + rtt + blocking
    link = figures.wire_seconds(lookup_down) + rtt
    return StepTime(max(cpu, link) + exposed, cpu, link + exposed)
