"""What a trainer rank says while it trains: one snapshot per step, shown on the progress
line, appended to the run directory's ``metrics.jsonl`` and exposed to Prometheus.

A snapshot's figures are cumulative since the first step (throughput, traffic, shares of
time) except ``loss`` and ``clock_lag``, which are the step's own.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Self, TextIO

from ember.trainer.config import TrainConfig
from ember.trainer.progress import ProgressLine
from ember.trainer.sources import RowSourceKind, TimedSource, pipeline_timing
from prometheus_client import CollectorRegistry, Counter, Gauge

from ember.metrics_endpoint import MetricsEndpoint

BYTE_CATEGORIES = ("pulled", "pushed", "hot_allreduce", "control")
# The plots `ember report` draws from a run directory (trainer/run_plots.py).
PLOTS = ("loss", "throughput", "hit_rate", "bytes_per_sample", "ps_wait")


def bytes_per_sample(source: RowSourceKind, samples: int) -> dict[str, float]:
    """The bytes each sample cost so far, by category (see TrafficStats)."""
    per = max(1, samples)
    traffic = source.traffic
    return {
        "pulled": traffic.bytes_pulled / per,
        "pushed": traffic.bytes_pushed / per,
        "hot_allreduce": getattr(source, "allreduce_bytes", 0) / per,
        "control": traffic.bytes_control / per,
    }


def hit_rate(source: RowSourceKind) -> float:
    """The share of looked-up rows served by hot rows on this rank (0 without a cache)."""
    return getattr(source, "hit_rate", lambda: 0.0)()


def step_snapshot(
    step: int, loss: float, source: TimedSource, config: TrainConfig, world: int, elapsed: float
) -> dict[str, Any]:
    """This rank's figures after ``step`` steps, ``elapsed`` seconds after the first began."""
    samples = step * config.batch_size
    timing = pipeline_timing(source.inner)
    elapsed = max(elapsed, 1e-9)
    return {
        "step": step,
        "elapsed_s": elapsed,
        "loss": loss,
        "samples_per_s": samples * world / elapsed,
        "hit_rate": hit_rate(source.inner),
        "bytes_per_sample": bytes_per_sample(source.inner, samples),
        "ps_wait_share": source.ps_wait_s / elapsed,
        "ps_wait_s": source.ps_wait_s,
        "overlapped_share": timing.overlapped / elapsed if timing else 0.0,
        "clock_lag": timing.lags[-1] if timing and timing.lags else 0,
    }


class TrainerMetrics:
    """A rank's Prometheus gauges, served at ``/metrics`` on ``port`` (0: a free one)."""

    def __init__(self, rank: int, host: str, port: int) -> None:
        self.registry = CollectorRegistry()
        labels = ("rank",)
        self._rank = str(rank)

        def gauge(name: str, text: str, extra: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, text, (*labels, *extra), registry=self.registry)

        self.steps = Counter("ember_trainer_steps", "Steps trained", labels, registry=self.registry)
        self.samples_per_s = gauge("ember_trainer_samples_per_second", "Samples/s, all ranks")
        self.loss = gauge("ember_trainer_loss", "Training loss of the last step")
        self.hit_rate = gauge("ember_trainer_hot_hit_rate", "Share of rows served by hot rows")
        self.bytes = gauge(
            "ember_trainer_bytes_per_sample", "Bytes per sample by category", ("category",)
        )
        self.wait_share = gauge(
            "ember_trainer_ps_wait_share", "Share of wall time the steps waited on the PS"
        )
        self.wait_seconds = gauge(
            "ember_trainer_ps_wait_seconds", "Seconds the steps waited on the PS so far"
        )
        self.clock_lag = gauge(
            "ember_trainer_row_clock_lag",
            "Staleness of the rows the last step used: clocks between the step and the newest "
            "clock every rank's updates were applied to",
        )
        self.endpoint = MetricsEndpoint(self.registry, host, port)

    def record(self, snapshot: dict[str, Any]) -> None:
        """Set every series from ``snapshot``."""
        rank = self._rank
        self.steps.labels(rank).inc()
        self.samples_per_s.labels(rank).set(snapshot["samples_per_s"])
        self.loss.labels(rank).set(snapshot["loss"])
        self.hit_rate.labels(rank).set(snapshot["hit_rate"])
        for category, value in snapshot["bytes_per_sample"].items():
            self.bytes.labels(rank, category).set(value)
        self.wait_share.labels(rank).set(snapshot["ps_wait_share"])
        self.wait_seconds.labels(rank).set(snapshot["ps_wait_s"])
        self.clock_lag.labels(rank).set(snapshot["clock_lag"])

    def close(self) -> None:
        """Stop serving."""
        self.endpoint.close()


class RunDirectory:
    """A run's directory: ``config.json`` at the start, ``metrics.jsonl`` (a snapshot per
    line, flushed as written) while training, ``report.json`` at the end. What an earlier
    run left there (its report, plots and summary) is removed first, so a report never
    mixes two runs."""

    def __init__(self, path: Path, config: TrainConfig) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        for name in ("report.json", "summary.md", *(f"{plot}.png" for plot in PLOTS)):
            (path / name).unlink(missing_ok=True)
        _write_json(path / "config.json", dataclasses.asdict(config))
        # Held open across the steps; finish() or close() closes it.
        self._metrics: TextIO = open(path / "metrics.jsonl", "w", encoding="utf-8")  # noqa: SIM115

    def record(self, snapshot: dict[str, Any]) -> None:
        """Append ``snapshot`` as a line."""
        self._metrics.write(json.dumps(snapshot) + "\n")
        self._metrics.flush()

    def finish(self, report: dict[str, Any]) -> None:
        """Write the final report and close the metrics file."""
        self._metrics.close()
        _write_json(self.path / "report.json", report)

    def close(self) -> None:
        """Close the metrics file (the run ended without a report)."""
        self._metrics.close()


def metrics_port_of_rank(port: int) -> int:
    """The metrics port of this process's rank: ``port`` + LOCAL_RANK, so that the ranks on
    one host never collide (0 stays 0: each takes a free port)."""
    return port + int(os.environ.get("LOCAL_RANK", "0")) if port else 0


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=2) + "\n")
    os.replace(tmp, path)


class Telemetry:
    """Everything a rank says while it trains: Prometheus gauges on every rank where
    ``metrics_port`` is set; the progress line and the run directory on rank 0 where asked.
    """

    def __init__(self, config: TrainConfig, rank: int, world: int) -> None:
        self._config, self._world = config, world
        self.metrics = self.run_dir = self.progress = None
        try:
            self._open(config, rank)
        except BaseException:
            self.close()
            raise

    def _open(self, config: TrainConfig, rank: int) -> None:
        self.metrics = (
            TrainerMetrics(rank, config.metrics_host, metrics_port_of_rank(config.metrics_port))
            if config.metrics_port is not None
            else None
        )
        self.run_dir = (
            RunDirectory(Path(config.run_dir), config) if config.run_dir and rank == 0 else None
        )
        self.progress = ProgressLine(config.steps) if config.progress and rank == 0 else None

    def step(self, step: int, loss: float, source: TimedSource, elapsed: float) -> None:
        """Record the figures after ``step`` steps, ``elapsed`` seconds after the first began."""
        snapshot = step_snapshot(step, loss, source, self._config, self._world, elapsed)
        if self.metrics is not None:
            self.metrics.record(snapshot)
        if self.run_dir is not None:
            self.run_dir.record(snapshot)
        if self.progress is not None:
            self.progress.update(snapshot)

    def finish(self, report: dict[str, Any]) -> None:
        """Write the final report into the run directory (rank 0)."""
        if self.run_dir is not None:
            self.run_dir.finish(report)
            self.run_dir = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving metrics; close what is open (again: nothing)."""
        if self.progress is not None:
            self.progress.close()
        if self.run_dir is not None:
            self.run_dir.close()
        if self.metrics is not None:
            self.metrics.close()
        self.progress = self.run_dir = self.metrics = None
