"""The report of one trainer rank's run: throughput, losses, traffic, and where time went."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from ember.trainer.config import TrainConfig
from ember.trainer.data.criteo import CriteoTSVReader
from ember.trainer.sources import RowSourceKind, pipeline_timing
from ember.trainer.telemetry import bytes_per_sample, hit_rate


def run_report(
    config: TrainConfig,
    rank: int,
    world: int,
    device: torch.device,
    losses: list[float],
    wall: float,
    source: RowSourceKind,
    exposed_wait: float,
    reader: CriteoTSVReader,
) -> dict:
    """The report's training fields (evaluation adds its own).

    ``exposed_wait`` is the time the steps spent inside the row source: waiting on the
    shards, or on the hot rows' all-reduce. A pipeline's lookups and updates also run in the
    background; ``ps_overlapped_s`` is the part of their time the steps did not wait for.
    """
    samples = len(losses) * config.batch_size
    timing = pipeline_timing(source)
    return {
        "rank": rank,
        "world_size": world,
        "device": str(device),
        "data_path": "pipeline" if config.pipelined() else "serial",
        "steps": len(losses),
        "samples_per_s": samples * world / wall if wall else 0.0,
        "cache_hit_rate": hit_rate(source),
        **{
            f"bytes_{name}_per_sample": value
            for name, value in bytes_per_sample(source, samples).items()
        },
        "bytes_replica_sync": source.traffic.bytes_replica_sync,
        "replica_rows_written_back": getattr(source, "rows_written_back", 0),
        "final_train_loss": float(np.mean(losses[-10:])) if losses else float("nan"),
        "train_losses": losses,
        "wall_s": wall,
        "ps_wait_s": exposed_wait,
        "ps_overlapped_s": timing.overlapped if timing else 0.0,
        "compute_s": wall - exposed_wait,
        "rows_to_update_s_per_step": timing.rows_to_update_per_step if timing else 0.0,
        "max_clock_lag": timing.max_lag if timing else 0,
        "clock_lags": timing.lags if timing else [],
        "malformed_lines": reader.stats.malformed,
        "config": dataclasses.asdict(config),
    }
