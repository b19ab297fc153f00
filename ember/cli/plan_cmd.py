"""``ember plan``: choose the replicated hot set and the staleness from a model of the traffic."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from ember.cli.endpoints import add_endpoint_flags, endpoints_from_args


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``plan`` subcommand."""
    parser = commands.add_parser(
        "plan",
        help="predict hit rate, bytes and step time of hot-set sizes and stalenesses, and "
        "choose the fastest within a memory budget (--cache-mb) and a staleness cap "
        "(--staleness; near-ties, within 5%%, go to the fewest seconds on the link)",
    )
    from ember.cli.train_cmd import add_training_flags

    add_training_flags(parser)
    add_endpoint_flags(parser)
    parser.add_argument("--ranks", type=int, default=1, help="trainer ranks of the run")
    parser.add_argument(
        "--profile",
        choices=("counted", "zipf"),
        default="counted",
        help="the id law: counted over the profile sample (Good-Turing corrected; the hot set "
        "the trainer picks from it), or a Zipf law fitted to it per table (predicts the law's "
        "most popular ids as the hot set: an upper bound where the sample is small)",
    )
    figures = parser.add_mutually_exclusive_group(required=True)
    figures.add_argument(
        "--calibrate",
        action="store_true",
        help="measure the machine figures with short runs against --endpoints (they train "
        "tables of their own, which stay on those shards: use a scratch cluster)",
    )
    figures.add_argument(
        "--figures", type=Path, help="machine figures from an earlier plan or calibration"
    )
    parser.add_argument(
        "--calibration-steps", type=int, default=30, help="steps of each calibration run"
    )
    parser.add_argument(
        "--bandwidth-mbit",
        type=float,
        default=None,
        help="plan for a link of this rate each way (default: the figures file's, else as "
        "fast as the calibration's)",
    )
    parser.add_argument(
        "--rtt-ms",
        type=float,
        default=None,
        help="the link's round trip beyond the calibration's (default: the figures file's, else 0)",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the plan JSON here")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Print the candidates and the plan; write the JSON with ``--out``."""
    from ember.cli.train_cmd import config_from_args
    from ember.trainer.plan.apply import plan_for, read_figures, workload_of, workload_profiles
    from ember.trainer.plan.planner import plan_table
    from ember.trainer.plan.profile import fitted_zipf
    from ember.trainer.train import synthetic_data, table_specs

    if args.ranks < 1:
        raise SystemExit(f"ember plan: --ranks must be >= 1, got {args.ranks}")
    if args.model != "dlrm":
        raise SystemExit("ember plan: plans the DLRM tables' hot set (--model dlrm)")
    endpoints = endpoints_from_args(args, "plan") if args.calibrate else ["unused:0"]
    config = config_from_args(args, endpoints)
    data = synthetic_data(config)
    names = [spec.name for spec in table_specs(config, data.num_features)]
    try:
        profiles = workload_profiles(config, data, names, args.ranks)
        if args.profile == "zipf":
            profiles = [fitted_zipf(profile) for profile in profiles]
        if args.calibrate:
            from ember.trainer.plan.calibration import calibrate

            figures, runs = calibrate(config, args.calibration_steps)
        else:
            figures, runs = read_figures(str(args.figures)), []
        figures = figures.on_link(
            figures.bandwidth_mbit if args.bandwidth_mbit is None else args.bandwidth_mbit,
            figures.rtt_ms if args.rtt_ms is None else args.rtt_ms,
        )
        plan = plan_for(config, profiles, figures, args.ranks)
    except ValueError as error:
        raise SystemExit(f"ember plan: {error}") from None
    print(plan_table(plan))
    if args.out is not None:
        document = {
            **plan.to_json(),
            "workload": workload_of(config, args.ranks),
            "profile": args.profile,
            "figures": figures.to_json(),
            "calibration_runs": [dataclasses.asdict(run) for run in runs],
        }
        args.out.write_text(json.dumps(document, indent=2) + "\n")
        print(f"plan written to {args.out}", file=sys.stderr)
    return 0
