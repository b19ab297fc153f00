"""The report of one trainer rank's run: throughput, losses, traffic, and where time went."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from ember.trainer.config import TrainConfig
from ember.trainer.data.criteo import CriteoTSVReader
from ember.trainer.sources import TimedSource, pipeline_timing
from ember.trainer.telemetry import bytes_per_sample, hit_rate


def run_report(
    config: TrainConfig,
    rank: int,
    world: int,
    device: torch.device,
    losses: list[float],
    wall: float,
    timed: TimedSource,
    reader: CriteoTSVReader,
) -> dict:
    """The report's training fields (evaluation adds its own).

    ``ps_wait_s`` is the exposed PS wait: the time the steps were blocked on the shards, or
    on other ranks in the hot rows' all-reduce. ``embedding_work_s`` is the rest of their
    time in the row source: this rank's own embedding work (hot rows' lookup and optimizer,
    planning the next steps' ids where the training thread does it or waits for it,
    splitting, placing rows), part of ``compute_s``. A pipeline's lookups and updates also
    run in the background; ``ps_overlapped_s`` is the part of their time the steps did not
    wait for.
    """
    samples = len(losses) * config.batch_size
    source, ps_wait = timed.inner, timed.ps_wait_s
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
        "ps_wait_s": ps_wait,
        "embedding_work_s": timed.embedding_work_s,
        "ps_overlapped_s": timing.overlapped if timing else 0.0,
        "compute_s": wall - ps_wait,
        "rows_to_update_s_per_step": timing.rows_to_update_per_step if timing else 0.0,
        "max_clock_lag": timing.max_lag if timing else 0,
        "clock_lags": timing.lags if timing else [],
        "malformed_lines": reader.stats.malformed,
        "config": dataclasses.asdict(config),
    }
