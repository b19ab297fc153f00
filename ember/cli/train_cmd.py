"""``ember train``: one trainer rank (run it under torchrun for several)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
from pathlib import Path

from ember.cli.endpoints import add_endpoint_flags, endpoints_from_args
from ember.env import env_value
from ember.ps_server.client.transport import TRANSPORTS
from ember.ps_server.wire.row_dtype import RowDtype


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
    """Flags shared by ``ember train`` and ``ember demo``."""
    parser.add_argument(
        "--steps", type=int, default=env_value("STEPS", 200), help="training steps per rank"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=env_value("BATCH_SIZE", 1024),
        help="samples per step and rank",
    )
    parser.add_argument(
        "--eval-batches", type=int, default=8, help="held-out batches evaluated on rank 0"
    )
    parser.add_argument("--dim", type=int, default=16, help="embedding width")
    parser.add_argument(
        "--optimizer",
        default="adagrad",
        help="sparse optimizer: sgd, adagrad, rowwise_adagrad, adam",
    )
    parser.add_argument("--sparse-lr", type=float, default=0.05)
    parser.add_argument("--dense-lr", type=float, default=0.05)
    parser.add_argument(
        "--max-cardinality", type=int, default=200_000, help="cap on ids per feature"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--table-prefix", default="criteo", help="PS tables are named PREFIX.f0 .. PREFIX.f25"
    )
    parser.add_argument(
        "--criteo",
        default=None,
        help="train on this Criteo TSV file instead of synthetic data; every "
        "--heldout-every-th line is held out for evaluation",
    )
    parser.add_argument(
        "--heldout-every",
        type=int,
        default=10,
        help="with --criteo, line n is held out when n %% N == N-1 (default: every tenth)",
    )
    parser.add_argument(
        "--device",
        default=env_value("DEVICE", "auto"),
        help="cpu, cuda or cuda:N; auto (default) is cuda where torch sees a GPU, else cpu. "
        "Under torchrun, cuda is cuda:LOCAL_RANK. The process group follows: NCCL on GPUs, "
        "gloo on CPUs (env EMBER_DEVICE)",
    )
    parser.add_argument(
        "--report", type=Path, default=None, help="write the JSON report here (rank 0)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no live progress line")
    parser.add_argument(
        "--cache",
        default="none",
        help="hot embeddings: none, static, lru, lfu (caches) or replicated",
    )
    parser.add_argument(
        "--cache-mb", type=float, default=16.0, help="cache memory budget per rank, MiB"
    )
    parser.add_argument("--pull-bound", type=int, default=0, help="versions a cached row may lag")
    parser.add_argument(
        "--push-bound", type=int, default=0, help="local updates a row may hold back"
    )
    parser.add_argument(
        "--zipf-exponent", type=float, default=1.2, help="skew of the synthetic ids"
    )
    parser.add_argument(
        "--profile-batches", type=int, default=32, help="batches the cache profiler samples"
    )
    parser.add_argument(
        "--data-path",
        default="auto",
        help="pipeline (auto, the default): each step's rows are fetched while the previous "
        "step computes and updates leave in the background, under step clocks for --cache "
        "none or replicated; the lru, lfu and static caches pull misses early and send "
        "their freshness checks behind the previous push. serial: pull, compute, push",
    )
    parser.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default=env_value("TRANSPORT", "grpc"),
        help="what carries the step calls: grpc, ucx (shards started with --ucx), or auto "
        "(ucx where every shard offers it) (env EMBER_TRANSPORT)",
    )
    parser.add_argument(
        "--wire-dtype",
        choices=[dtype.name.lower() for dtype in RowDtype],
        default="float32",
        help="pipeline: how cold rows and their gradients travel; float16 and bfloat16 halve "
        "their bytes (the shards keep float32 rows and optimizer state). bfloat16 keeps "
        "float32's range; float16 refuses values beyond 65504",
    )
    parser.add_argument(
        "--staleness",
        type=int,
        default=0,
        help="pipeline: step t reads every rank's updates of steps <= t-1-S; 0 is exact",
    )
    parser.add_argument(
        "--update-mode",
        default="exact",
        help="pipeline: exact (the shards sum every rank's gradients of a step into one "
        "optimizer step per row, as one process would) or async (one step per rank's update)",
    )
    parser.add_argument(
        "--wait-s",
        type=float,
        default=120.0,
        help="pipeline: how long a shard holds a step for other ranks before it fails, "
        "naming the ranks it waited for",
    )
    parser.add_argument(
        "--flush-every",
        type=int,
        default=1000,
        help="--cache replicated: write the hot rows stepped since the last write-back to "
        "the shards every N steps (what a crashed trainer can lose); 0: at the end only. "
        "Caches push each row after --push-bound local updates",
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=0,
        help="intra-op threads of this rank's tensor ops (0: torch's default). Use 1 when "
        "shards share the rank's cores: idle OpenMP threads spin and take their CPU",
    )


# TrainConfig fields whose flag is not --<field-with-dashes>.
_FLAG_OF = {"criteo_path": "--criteo"}
_NOT_FLAGS = ("endpoints", "progress")


def config_from_args(args: argparse.Namespace, endpoints: list[str]):
    """The TrainConfig the flags describe; SystemExit with the reason if invalid."""
    from ember.trainer.config import TrainConfig

    values = {
        field.name: getattr(
            args, _FLAG_OF.get(field.name, "--" + field.name).lstrip("-").replace("-", "_")
        )
        for field in dataclasses.fields(TrainConfig)
        if field.name not in _NOT_FLAGS
    }
    config = TrainConfig(endpoints=tuple(endpoints), progress=not args.no_progress, **values)
    try:
        config.validate()
    except ValueError as error:
        raise SystemExit(f"ember: {error}") from None
    return config


def train_argv(config) -> list[str]:
    """``ember train`` flags that reproduce ``config`` (inverse of config_from_args)."""
    argv = ["--endpoints", ",".join(config.endpoints)]
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.name in _NOT_FLAGS or value is None:
            continue
        argv += [_FLAG_OF.get(field.name, "--" + field.name.replace("_", "-")), str(value)]
    return argv + ([] if config.progress else ["--no-progress"])


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
            args.report.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def print_summary(report: dict) -> None:
    """Print the headline figures of a training report."""
    config = report["config"]
    print("-" * 60)
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
        f"wall {wall:.1f} s = compute {report['compute_s']:.1f} s + exposed PS wait "
        f"{report['ps_wait_s']:.1f} s ({report['ps_wait_s'] / wall if wall else 0:.0%}); "
        f"PS time overlapped {report['ps_overlapped_s']:.1f} s; max clock lag "
        f"{report['max_clock_lag']}"
    )
