"""``ember train --plan``: turn a plan (made now, or read from a file) into the run's config.

A plan sets three things of a run: the replicated hot set (``cache
replicated``, its size as ``cache_mb``; or ``none`` for no hot set) and the
staleness. ``--plan auto`` makes the plan at the start of the run from the
run's own profile sample, with ``cache_mb`` as the budget, ``staleness`` as
the cap and the machine figures of ``--plan-figures``; ``--plan FILE``
applies a plan ``ember plan`` wrote for the same workload. Rank 0 makes or
reads the plan and sends it to the others (or its error, which every rank
raises), so every rank runs the same plan.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path

from ember.kernels.optim import state_width
from ember.ps_server.wire.row_dtype import RowDtype
from ember.ps_server.wire.table_spec import OptimizerKind
from ember.trainer.config import TrainConfig
from ember.trainer.data.synthetic import SyntheticCriteo
from ember.trainer.pipeline import MAX_STALENESS
from ember.trainer.plan.planner import Plan, make_plan
from ember.trainer.plan.profile import TableProfile, counted_profile
from ember.trainer.plan.step_model import MachineFigures
from ember.trainer.plan.traffic_model import TrafficModel, Workload
from ember.trainer.rank_zero import decided_on_rank_zero
from ember.trainer.sources import hot_row_bytes, profile_batches

log = logging.getLogger(__name__)


def workload_profiles(
    config: TrainConfig, data: SyntheticCriteo, feature_tables: list[str], world: int
) -> list[TableProfile]:
    """The id profile of the hot set's sample (part 0 of ``profile_batches`` batches)."""
    if config.criteo_path is None:
        cardinalities = list(data.config.cardinalities)
    else:
        cardinalities = [config.max_cardinality] * len(feature_tables)
    return counted_profile(profile_batches(config, data, 0, world), feature_tables, cardinalities)


def plan_for(
    config: TrainConfig,
    profiles: list[TableProfile],
    figures: MachineFigures,
    world: int,
) -> Plan:
    """The plan of ``config``'s workload: budget ``cache_mb``, staleness cap ``staleness``
    (from 1 with async updates)."""
    return make_plan(
        TrafficModel(profiles, workload_for(config, figures, world)),
        figures,
        int(config.cache_mb * 2**20),
        config.staleness,
        min_staleness=1 if config.update_mode == "async" else 0,
    )


def workload_for(config: TrainConfig, figures: MachineFigures, world: int) -> Workload:
    """What the traffic model needs to know of ``config``'s run."""
    return Workload(
        config.dim,
        config.batch_size,
        world,
        row_bytes=RowDtype.parse(config.wire_dtype).itemsize * config.dim,
        control_bytes_per_step=figures.control_bytes_per_step,
        state_floats=state_width(OptimizerKind[config.optimizer.upper()], config.dim),
        steps=config.steps,
        flush_every=config.flush_every,
    )


def read_figures(path: str) -> MachineFigures:
    """Machine figures from a plan or figures file (``figures`` inside a plan)."""
    table = _read_json(path, "figures")
    return MachineFigures.from_json(table.get("figures", table))


def applied(
    config: TrainConfig, data: SyntheticCriteo, feature_tables: list[str], world: int
) -> TrainConfig:
    """``config`` with its plan applied (unchanged without one).

    Raises:
        ValueError: on every rank: no figures for ``auto``, or a plan file that is
            unreadable, malformed or made for another workload.
    """
    if not config.plan:
        return config
    plan = decided_on_rank_zero(
        lambda: _plan_document(config, data, feature_tables, world), world, "planning"
    )
    return _with_plan(config, plan, world)


def _plan_document(
    config: TrainConfig, data: SyntheticCriteo, feature_tables: list[str], world: int
) -> dict:
    if config.plan != "auto":
        return _read_json(config.plan, "plan")
    if not config.plan_figures:
        raise ValueError(
            "--plan auto needs machine figures: --plan-figures FILE, written by "
            "`ember plan --calibrate --out FILE`"
        )
    profiles = workload_profiles(config, data, feature_tables, world)
    plan = plan_for(config, profiles, read_figures(config.plan_figures), world)
    return {**plan.to_json(), "workload": workload_of(config, world)}


def workload_of(config: TrainConfig, world: int) -> dict:
    """What a plan file records of the run it was made for (checked when applied)."""
    return {
        "dim": config.dim,
        "batch_size": config.batch_size,
        "ranks": world,
        "table_prefix": config.table_prefix,
        "criteo_path": config.criteo_path,
        "max_cardinality": config.max_cardinality,
        "zipf_exponent": config.zipf_exponent,
        "seed": config.seed,
        "profile_batches": config.profile_batches,
        "wire_dtype": config.wire_dtype,
        "update_mode": config.update_mode,
        "optimizer": config.optimizer,
        "steps": config.steps,
        "flush_every": config.flush_every,
    }


def _with_plan(config: TrainConfig, plan: dict, world: int) -> TrainConfig:
    made_for = plan.get("workload")
    expected = workload_of(config, world)
    if made_for != expected:
        different = sorted(k for k in expected if (made_for or {}).get(k) != expected[k])
        raise ValueError(
            f"the plan was made for another workload: {', '.join(different)} differ "
            "(make it again with `ember plan` and this run's flags)"
        )
    replicated = dataclasses.replace(config, cache="replicated")
    hot_rows, cache_mb, staleness = _choice(plan, hot_row_bytes(replicated))
    choice = plan["choice"]
    log.info(
        "plan: %d hot rows (%.2f MiB), staleness %d; predicted %.0f samples/s, %.2fx the "
        "pipeline without a hot set",
        hot_rows, cache_mb, staleness, choice.get("samples_per_s", 0.0),
        plan.get("predicted_gain", 0.0),
    )  # fmt: skip
    planned = dataclasses.replace(
        config,
        plan="",
        plan_figures="",
        cache="replicated" if hot_rows else "none",
        cache_mb=cache_mb if hot_rows else config.cache_mb,
        staleness=staleness,
    )
    planned.validate()
    return planned


def _choice(plan: dict, hot_row_bytes: int) -> tuple[int, float, int]:
    """``(hot_rows, cache_mb, staleness)`` of a plan, each checked."""
    try:
        choice = plan["choice"]
        hot_rows, staleness = choice["hot_rows"], choice["staleness"]
        cache_mb = float(choice["cache_mb"])
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"the plan has no valid choice ({error})") from None
    if not all(type(n) is int for n in (hot_rows, staleness)):
        raise ValueError(
            f"the plan's hot_rows and staleness must be integers, got {hot_rows!r}, {staleness!r}"
        )
    if hot_rows < 0 or not 0 <= staleness <= MAX_STALENESS:
        raise ValueError(
            f"the plan's choice is out of range: {hot_rows} hot rows, staleness {staleness}"
        )
    if hot_rows and not (
        math.isfinite(cache_mb) and int(cache_mb * 2**20) // hot_row_bytes == hot_rows
    ):
        raise ValueError(
            f"the plan's cache_mb {cache_mb} does not hold exactly its {hot_rows} hot rows "
            f"of {hot_row_bytes} bytes"
        )
    return hot_rows, cache_mb, staleness


def _read_json(path: str, what: str) -> dict:
    try:
        table = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot read the {what} file {path}: {error}") from None
    if not isinstance(table, dict):
        raise ValueError(f"the {what} file {path} does not hold a JSON object")  # noqa: TRY004 - bad input, not a bad call
    return table
