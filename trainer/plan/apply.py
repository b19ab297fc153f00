"""``ember train --plan``: turn a plan (made now, or read from a file) into the run's config.

A plan sets three things of a run: the replicated hot set (``cache
replicated``, its size as ``cache_mb``) and the staleness. ``--plan auto``
makes the plan at the start of the run from the run's own profile sample,
with ``cache_mb`` as the budget, ``staleness`` as the cap and the machine
figures of ``--plan-figures``; ``--plan FILE`` applies a plan ``ember plan``
wrote for the same workload. Every rank computes the same plan (the profile
is the replicated hot set's: data part 0).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from ember.trainer.config import TrainConfig
from ember.trainer.data.synthetic import SyntheticCriteo
from ember.trainer.plan.planner import Plan, make_plan
from ember.trainer.plan.profile import TableProfile, counted_profile
from ember.trainer.plan.step_model import MachineFigures
from ember.trainer.plan.traffic_model import TrafficModel, Workload

log = logging.getLogger(__name__)


def workload_profiles(
    config: TrainConfig, data: SyntheticCriteo, feature_tables: list[str], world: int
) -> list[TableProfile]:
    """The id profile of the hot set's sample (part 0 of ``profile_batches`` batches)."""
    from ember.trainer.sources import profile_batches

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
    """The plan of ``config``'s workload: budget ``cache_mb``, staleness cap ``staleness``."""
    workload = Workload(
        config.dim, config.batch_size, world, control_bytes_per_step=figures.control_bytes_per_step
    )
    return make_plan(
        TrafficModel(profiles, workload), figures, int(config.cache_mb * 2**20), config.staleness
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
        ValueError: no figures for ``auto``, or a plan file that is unreadable or was made
            for another workload.
    """
    if not config.plan:
        return config
    if config.plan == "auto":
        if not config.plan_figures:
            raise ValueError(
                "--plan auto needs machine figures: --plan-figures FILE, written by "
                "`ember plan --calibrate --out FILE`"
            )
        profiles = workload_profiles(config, data, feature_tables, world)
        plan = plan_for(config, profiles, read_figures(config.plan_figures), world).to_json()
        plan["workload"] = workload_of(config, world)
    else:
        plan = _read_json(config.plan, "plan")
    return _with_plan(config, plan, world)


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
    try:
        choice = plan["choice"]
        cache_mb, staleness = float(choice["cache_mb"]), int(choice["staleness"])
        hot_rows = int(choice["hot_rows"])
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"the plan has no valid choice ({error})") from None
    log.info(
        "plan: %d hot rows (%.2f MiB), staleness %d; predicted %.0f samples/s, %.2fx the "
        "exact pipeline without a hot set",
        hot_rows, cache_mb, staleness, choice.get("samples_per_s", 0.0),
        plan.get("predicted_gain", 0.0),
    )  # fmt: skip
    cache = "replicated" if hot_rows else "none"
    planned = dataclasses.replace(
        config, plan="", plan_figures="", cache=cache, cache_mb=cache_mb, staleness=staleness
    )
    planned.validate()
    return planned


def _read_json(path: str, what: str) -> dict:
    try:
        table = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot read the {what} file {path}: {error}") from None
    if not isinstance(table, dict):
        raise ValueError(f"the {what} file {path} does not hold a JSON object")  # noqa: TRY004 - bad input, not a bad call
    return table
