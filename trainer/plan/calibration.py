"""Measure a machine's step-cost figures with short training runs on throwaway tables.

Two hot-set sizes at staleness 0 and at staleness 1 (exact updates), each run twice
(the faster counts), give the CPU cost lines of :class:`MachineFigures` (step seconds
against the cold rows each run actually moved, and at staleness 1 the compute from each
step's rows to its update, which the lookup-after-update chain cannot hide). The runs train tables of their own (``<prefix>.calibration*``)
so the model a plan is for is left untouched. Run it where the shards are
reached over a fast network (or loopback) and give the production link's
bandwidth and round trip to the planner.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from ember.ps_server.wire.row_dtype import RowDtype
from ember.trainer.config import TrainConfig
from ember.trainer.plan.step_model import CostLine, MachineFigures
from ember.trainer.plan.traffic_model import ID_BYTES
from ember.trainer.sources import hot_row_bytes
from ember.trainer.train import train

log = logging.getLogger(__name__)

CALIBRATION_SHARES = (1 / 64, 1.0)  # hot-set sizes, as shares of the budget
CALIBRATION_REPEATS = 2


@dataclasses.dataclass(frozen=True)
class CalibrationRun:
    """One short run's measured step time and cold rows per step."""

    cache_mb: float
    staleness: int
    step_s: float  # without the run's last write-back
    rows_to_update_s: float  # per step: the compute that needs the step's rows
    cold_rows: float
    control_bytes_per_step: float
    writeback_s: float  # the last write-back (and the drain of the updates in flight)
    rows_written_back: int


def calibrate(config: TrainConfig, steps: int = 30) -> tuple[MachineFigures, list[CalibrationRun]]:
    """The figures of ``config``'s machine and shards, from short runs of its workload.

    ``config.cache_mb`` is the budget whose shares are measured. One process: run it
    outside torchrun.

    Raises:
        ValueError: under torchrun (several ranks would each calibrate), or steps < 5.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) != 1:
        raise ValueError("calibrate in one process (not under torchrun)")
    if steps < 5:
        raise ValueError(f"a calibration run needs >= 5 steps, got {steps}")
    smallest = config.cache_mb * min(CALIBRATION_SHARES) * 2**20
    per_row = hot_row_bytes(dataclasses.replace(config, cache="replicated"))
    if smallest < per_row:
        raise ValueError(
            f"calibration runs {min(CALIBRATION_SHARES):.4g} of the budget, which must hold a "
            f"hot row ({per_row} bytes): give --cache-mb >= "
            f"{per_row / min(CALIBRATION_SHARES) / 2**20:.3f}"
        )
    base = dataclasses.replace(
        config, steps=steps, eval_batches=1, progress=False, run_dir="", metrics_port=None,
        cache="replicated", data_path="pipeline", update_mode="exact", plan="",
    )  # fmt: skip
    _run(base, config.cache_mb, 1, "warm-up")  # loads kernels and warms the shards
    settings = [
        (config.cache_mb * share, staleness, f"{staleness}-{number}")
        for staleness in (0, 1)
        for number, share in enumerate(CALIBRATION_SHARES)
    ]
    # Every setting runs CALIBRATION_REPEATS times, the settings in turn (so drift on a
    # shared machine hits each alike); the fastest of each counts (interference only slows).
    rounds = [
        [
            _run(base, cache_mb, staleness, f"{name}-{round_}")
            for cache_mb, staleness, name in settings
        ]
        for round_ in range(CALIBRATION_REPEATS)
    ]
    runs = [min(repeats, key=lambda r: r.step_s) for repeats in zip(*rounds)]
    lines = {
        staleness: CostLine.fit(
            [r.cold_rows for r in runs if r.staleness == staleness],
            [r.step_s for r in runs if r.staleness == staleness],
        )
        for staleness in (0, 1)
    }
    stale_runs = [r for r in runs if r.staleness == 1]
    chain = CostLine.fit(
        [r.cold_rows for r in stale_runs], [r.rows_to_update_s for r in stale_runs]
    )
    colds = sorted(r.cold_rows for r in runs)
    if colds[-1] < 1.2 * colds[0]:
        raise ValueError(
            f"the calibration runs moved nearly the same cold rows ({colds[0]:.0f} to "
            f"{colds[-1]:.0f} per step), so the cost of a cold row cannot be measured: "
            "calibrate with a budget (--cache-mb) whose hot set covers more of the lookups"
        )
    stale = [r.control_bytes_per_step for r in stale_runs]
    written = sum(r.rows_written_back for r in runs)
    figures = MachineFigures(
        lines[0],
        lines[1],
        control_bytes_per_step=sum(stale) / len(stale),
        writeback_s_per_row=sum(r.writeback_s for r in runs) / written if written else 0.0,
        cpu_chain=chain,
    )
    return figures, runs


def _run(base: TrainConfig, cache_mb: float, staleness: int, name: str) -> CalibrationRun:
    config = dataclasses.replace(
        base,
        cache_mb=cache_mb,
        staleness=staleness,
        table_prefix=f"{base.table_prefix}.calibration-{name}-{os.getpid()}",
    )
    report = train(config)
    batch = config.batch_size
    row_bytes = ID_BYTES + RowDtype.parse(config.wire_dtype).itemsize * config.dim
    run = CalibrationRun(
        cache_mb,
        staleness,
        step_s=(report["wall_s"] - report["final_flush_s"]) / report["steps"],
        rows_to_update_s=report["rows_to_update_s_per_step"],
        cold_rows=report["bytes_pushed_per_sample"] * batch / row_bytes,
        control_bytes_per_step=report["bytes_control_per_sample"] * batch,
        writeback_s=report["final_flush_s"],
        rows_written_back=report["replica_rows_written_back"],
    )
    log.info("calibration run %s: %s", name, run)
    return run
