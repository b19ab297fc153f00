"""Choose the hot set and the staleness that maximise predicted throughput under a budget.

Candidates are hot sets of a geometric ladder of sizes up to the memory
budget (and none), each at every staleness up to the cap. Each is scored by
the traffic model and the step model. The plan is chosen among the candidates
predicted within ``TIE_MARGIN`` of the fastest (and no slower than the
baseline below): the fewest seconds on the link per step (its bytes,
write-backs included, at the figures' bandwidth), then the fastest, then the
smaller staleness. Predicted bytes are the model's surest figure (within about
5% of measured runs, step times within about 20%: benchmarks/RESULTS.md), so
among near-ties the plan takes the one least exposed to a link slower or
busier than its figures, for at most the margin. Figures without a
bandwidth (a fast network) leave nothing to hedge: the fastest is taken. Its gain is the predicted
speed-up over the pipeline without a hot set at the lowest staleness allowed
(0, the exact pipeline, unless updates are async).
"""

from __future__ import annotations

import dataclasses

from ember.trainer.plan.step_model import MachineFigures, step_time
from ember.trainer.plan.traffic_model import TrafficModel

LADDER_STEPS = 12  # sizes budget / 2^j, j < LADDER_STEPS
TIE_MARGIN = 0.05  # candidates this close to the fastest prediction count as ties


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One hot-set size and staleness with its predictions."""

    hot_rows: int
    staleness: int
    hit_rate: float
    cold_rows: float
    bytes_per_sample: dict[str, float]
    writeback_bytes_per_step: float  # the hot rows' write-backs, amortised
    step_s: float
    bound: str
    samples_per_s: float

    def bytes_per_step(self, batch_size: int) -> float:
        """Predicted bytes per step on the wire, the amortised write-backs included."""
        return sum(self.bytes_per_sample.values()) * batch_size + self.writeback_bytes_per_step

    def cache_mb(self, hot_row_bytes: int) -> float:
        """The ``cache_mb`` that makes the trainer's profiler keep exactly ``hot_rows``."""
        return (self.hot_rows + 0.5) * hot_row_bytes / 2**20


@dataclasses.dataclass(frozen=True)
class Plan:
    """The chosen candidate, the baseline it is compared with, and every candidate."""

    choice: Candidate
    baseline: Candidate
    candidates: list[Candidate]
    budget_bytes: int
    hot_row_bytes: int
    tie_margin: float = 0.0

    @property
    def predicted_gain(self) -> float:
        """Predicted samples/s of the choice over the baseline's."""
        return self.choice.samples_per_s / self.baseline.samples_per_s

    def to_json(self) -> dict:
        """The plan as written by ``ember plan`` (and read by ``ember train --plan``)."""
        return {
            "choice": {
                **dataclasses.asdict(self.choice),
                "cache_mb": self.choice.cache_mb(self.hot_row_bytes),
            },
            "predicted_gain": self.predicted_gain,
            "baseline": {
                "name": "no hot set, lowest staleness",
                **dataclasses.asdict(self.baseline),
            },
            "budget_bytes": self.budget_bytes,
            "tie_margin": self.tie_margin,
            "fastest_samples_per_s": max(c.samples_per_s for c in self.candidates),
            "hot_row_bytes": self.hot_row_bytes,
            "candidates": [dataclasses.asdict(c) for c in self.candidates],
        }


def evaluate(
    model: TrafficModel, figures: MachineFigures, hot_rows: int, staleness: int
) -> Candidate:
    """The predictions of one hot-set size and staleness."""
    traffic = model.traffic(hot_rows, staleness)
    step = step_time(traffic, staleness, figures, model.workload.ranks)
    batch = model.workload.batch_size
    return Candidate(
        hot_rows=hot_rows,
        staleness=staleness,
        hit_rate=traffic.hit_rate,
        cold_rows=traffic.cold_rows,
        bytes_per_sample=traffic.per_sample(batch),
        writeback_bytes_per_step=traffic.bytes_writeback,
        step_s=step.seconds,
        bound=step.bound,
        samples_per_s=batch * model.workload.ranks / step.seconds,
    )


def make_plan(
    model: TrafficModel,
    figures: MachineFigures,
    budget_bytes: int,
    max_staleness: int,
    min_staleness: int = 0,
    tie_margin: float = TIE_MARGIN,
) -> Plan:
    """The hot set within ``budget_bytes`` and the staleness within ``min_staleness ..
    max_staleness`` (async updates need at least 1) predicted fastest, near-ties (within
    ``tie_margin`` of the fastest, none slower than the baseline) going to the fewer
    seconds on the link per step (without a bandwidth: the fastest), exact ties to the
    smaller staleness.

    Raises:
        ValueError: a budget smaller than one hot row, a staleness range that is empty
            or negative, or a tie margin outside [0, 1).

    Example:
        >>> from ember.trainer.plan.profile import zipf_profile
        >>> from ember.trainer.plan.step_model import CostLine
        >>> from ember.trainer.plan.traffic_model import Workload
        >>> model = TrafficModel([zipf_profile("t", 10_000, 1.1)], Workload(16, 1024))
        >>> cpu = CostLine(0.05, 2e-6)
        >>> plan = make_plan(model, MachineFigures(cpu, cpu, bandwidth_mbit=25), 2**20, 1)
        >>> plan.choice.hot_rows > 0, bool(plan.predicted_gain > 1)
        (True, True)
    """
    row_bytes = model.workload.hot_row_bytes
    if budget_bytes < row_bytes:
        raise ValueError(
            f"a budget of {budget_bytes} bytes holds no hot row of dim {model.workload.dim} "
            f"({row_bytes} bytes each)"
        )
    if not 0 <= tie_margin < 1:
        raise ValueError(f"the tie margin must be in [0, 1), got {tie_margin}")
    if not 0 <= min_staleness <= max_staleness:
        raise ValueError(
            f"the staleness range {min_staleness}..{max_staleness} is empty or negative"
        )
    largest = model.rows_for_budget(budget_bytes)
    sizes = sorted({0, *(largest >> j for j in range(LADDER_STEPS))})
    candidates = [
        evaluate(model, figures, rows, s)
        for rows in sizes
        for s in range(min_staleness, max_staleness + 1)
    ]
    baseline = evaluate(model, figures, 0, min_staleness)  # one of the candidates
    floor = max((1 - tie_margin) * max(c.samples_per_s for c in candidates), baseline.samples_per_s)
    batch = model.workload.batch_size
    choice = min(
        (c for c in candidates if c.samples_per_s >= floor),
        key=lambda c: (
            figures.wire_seconds(c.bytes_per_step(batch)),
            -c.samples_per_s,
            c.staleness,
            c.hot_rows,
        ),
    )
    return Plan(choice, baseline, candidates, budget_bytes, row_bytes, tie_margin)


def plan_table(plan: Plan) -> str:
    """The candidates as a text table, the choice marked."""
    header = (
        f"{'hot rows':>9} {'MiB':>7} {'s':>2} {'hit rate':>8} {'cold/step':>9} "
        f"{'B/sample':>9} {'WB B/step':>9} {'step ms':>8} {'bound':>5} {'samples/s':>10}"
    )
    lines = [header]
    for c in plan.candidates:
        mark = "  <- plan" if c == plan.choice else ""
        lines.append(
            f"{c.hot_rows:>9} {c.cache_mb(plan.hot_row_bytes):>7.2f} {c.staleness:>2} "
            f"{c.hit_rate:>8.3f} {c.cold_rows:>9.0f} {sum(c.bytes_per_sample.values()):>9.0f} "
            f"{c.writeback_bytes_per_step:>9.0f} {c.step_s * 1000:>8.1f} {c.bound:>5} {c.samples_per_s:>10.0f}{mark}"
        )
    lines.append(
        f"plan: {plan.choice.hot_rows} hot rows, staleness {plan.choice.staleness}: predicted "
        f"{plan.choice.samples_per_s:.0f} samples/s, {plan.predicted_gain:.2f}x the "
        f"pipeline without a hot set (staleness {plan.baseline.staleness})"
    )
    return "\n".join(lines)
