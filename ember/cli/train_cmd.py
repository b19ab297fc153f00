"""``ember train``: one trainer rank (run it under torchrun for several)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from ember.cli.endpoints import add_endpoint_flags, endpoints_from_args
from ember.settings import add_setting_flags, settings_from_args


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``train`` subcommand."""
    parser = commands.add_parser(
        "train",
        help="train DLRM with embeddings on the parameter servers (one rank; use torchrun for more)",
    )
    add_training_flags(parser)
    add_endpoint_flags(parser)
    parser.set_defaults(run=run)


def add_training_flags(parser: argparse.ArgumentParser) -> None:
    """Flags shared by ``ember train`` and ``ember demo``: every TrainConfig and ClientConfig
    setting, and where the report goes."""
    from ember.ps_server.client.config import ClientConfig
    from ember.trainer.config import TrainConfig

    add_setting_flags(parser, TrainConfig)
    add_setting_flags(parser, ClientConfig)
    parser.add_argument(
        "--report", type=Path, default=None, help="write the JSON report here (rank 0)"
    )


def config_from_args(args: argparse.Namespace, endpoints: list[str]):
    """The TrainConfig the flags describe; SystemExit with the reason if invalid."""
    from ember.ps_server.client.config import ClientConfig
    from ember.trainer.config import TrainConfig

    client = settings_from_args(ClientConfig, args)
    config = settings_from_args(TrainConfig, args, endpoints=tuple(endpoints), client=client)
    try:
        config.validate()
    except ValueError as error:
        raise SystemExit(f"ember: {error}") from None
    return config


def run(args: argparse.Namespace) -> int:
    """Train this rank; rank 0 prints the summary and writes the report."""
    from ember.trainer.train import train

    # torchrun stops the other ranks with SIGTERM when one fails: unwind (and release this
    # job's replicas on the shards) instead of dying on the spot.
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))
    report = train(config_from_args(args, endpoints_from_args(args, "train")))
    if report["rank"] == 0:
        print_summary(report)
        if args.report is not None:
            args.report.parent.mkdir(parents=True, exist_ok=True)
            args.report.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def print_summary(report: dict) -> None:
    """Print the headline figures of a training report."""
    config = report["config"]
    print("-" * 60)
    if report.get("model") == "sasrec":
        cost = report["balance_cost"]
        print(
            f"ranks {report['world_size']}  steps {report['steps']}  samples/s "
            f"{report['samples_per_s']:,.0f}  balancer {report['balancer']} (sample cost "
            f"{cost['fixed']:.3g} + {cost['scale']:.3g} L^{cost['alpha']:.2f})"
            f"  straggler ratio {report['straggler_ratio']:.2f} (predicted "
            f"{report['predicted_straggler_ratio']:.2f})  final train loss "
            f"{report['final_train_loss']:.4f}"
        )
        print(
            f"held-out HR@10 {report.get('heldout_hr10', float('nan')):.4f}  NDCG@10 "
            f"{report.get('heldout_ndcg10', float('nan')):.4f}; popularity HR@10 "
            f"{report.get('popularity_hr10', float('nan')):.4f}; histories truncated "
            f"{report['truncated_histories']}, dropped (under 2 items) "
            f"{report['dropped_empty_histories']}"
        )
        return
    print(
        f"ranks {report['world_size']}  steps {report['steps']}  samples/s "
        f"{report['samples_per_s']:,.0f}  data path {report['data_path']}"
        + (f" (staleness {config['staleness']})" if report["data_path"] == "pipeline" else "")
    )
    print(
        f"final train loss {report['final_train_loss']:.4f}  held-out AUC "
        f"{report['heldout_auc']:.4f}  logloss {report['heldout_logloss']:.4f}"
    )
    print(
        f"bytes/sample pulled {report['bytes_pulled_per_sample']:,.0f}  pushed "
        f"{report['bytes_pushed_per_sample']:,.0f}  hot all-reduce "
        f"{report['bytes_hot_allreduce_per_sample']:,.0f}  control "
        f"{report['bytes_control_per_sample']:,.0f}  hot hit rate "
        f"{report['cache_hit_rate']:.1%}; hot replicas loaded and written back "
        f"{report['bytes_replica_sync'] / 2**20:,.1f} MiB"
    )
    wall = report["wall_s"]
    print(
        f"wall {wall:.1f} s = compute {report['compute_s']:.1f} s (embedding work on this "
        f"rank {report['embedding_work_s']:.1f} s) + exposed PS wait "
        f"{report['ps_wait_s']:.1f} s ({report['ps_wait_s'] / wall if wall else 0:.0%}); "
        f"PS time overlapped {report['ps_overlapped_s']:.1f} s; max clock lag "
        f"{report['max_clock_lag']}"
    )
