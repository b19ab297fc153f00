"""``ember report RUN_DIR``: PNG plots and a Markdown summary of a trainer's run directory.

Reads what :class:`~ember.trainer.telemetry.RunDirectory` wrote: ``config.json``,
``metrics.jsonl`` (a snapshot per step) and ``report.json``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ember.trainer.telemetry import BYTE_CATEGORIES


class RunDirectoryError(ValueError):
    """A run directory that is missing a file or holds one that cannot be read."""


def read_run(run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """The config, the per-step snapshots and the final report of ``run_dir``.

    Raises:
        RunDirectoryError: a file is missing or not valid JSON (naming it and the line).
    """

    def load(name: str) -> Any:
        try:
            return json.loads((run_dir / name).read_text())
        except (OSError, ValueError) as error:
            raise RunDirectoryError(f"{run_dir / name}: {error}") from None

    config, report = load("config.json"), load("report.json")
    snapshots = []
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError as error:
        raise RunDirectoryError(f"{run_dir / 'metrics.jsonl'}: {error}") from None
    for number, line in enumerate(lines, 1):
        try:
            snapshots.append(json.loads(line))
        except ValueError as error:
            raise RunDirectoryError(f"{run_dir / 'metrics.jsonl'} line {number}: {error}") from None
    if not snapshots:
        raise RunDirectoryError(f"{run_dir / 'metrics.jsonl'}: no steps recorded")
    return config, snapshots, report


def render_plots(run_dir: Path) -> list[Path]:
    """Write one PNG per figure of :data:`PLOTS` into ``run_dir``; their paths.

    Raises:
        RunDirectoryError: see :func:`read_run`.
        ImportError: matplotlib is not installed (``pip install 'ember-ps[report]'``).
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import MaxNLocator

    _, snapshots, report = read_run(run_dir)
    steps = [s["step"] for s in snapshots]
    paths = []

    def figure(name: str, title: str, ylabel: str):
        fig, axes = plt.subplots(figsize=(7, 4), dpi=110)
        axes.set_title(title)
        axes.set_xlabel("step")
        axes.set_ylabel(ylabel)
        axes.grid(True, alpha=0.3)
        return fig, axes

    def save(fig, name: str) -> None:
        fig.tight_layout()
        path = run_dir / f"{name}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)

    fig, axes = figure("loss", "Training loss (mean over ranks)", "binary cross-entropy")
    axes.plot(steps, [s["loss"] for s in snapshots], color="tab:blue", label="train loss")
    auc = report.get("heldout_auc", float("nan"))
    if not math.isnan(auc):
        axes.text(
            0.98, 0.95, f"held-out AUC {auc:.4f}\nlog loss {report['heldout_logloss']:.4f}",
            transform=axes.transAxes, ha="right", va="top",
            bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.8},
        )  # fmt: skip
    axes.legend(loc="lower left")
    save(fig, "loss")

    fig, axes = figure("throughput", "Throughput (all ranks, since the start)", "samples / s")
    axes.plot(steps, [s["samples_per_s"] for s in snapshots], color="tab:green")
    axes.set_ylim(bottom=0)
    save(fig, "throughput")

    fig, axes = figure("hit_rate", "Rows served by hot rows on the trainer", "hit rate (%)")
    axes.plot(steps, [100 * s["hit_rate"] for s in snapshots], color="tab:orange")
    axes.set_ylim(0, 105)  # a line at 100% stays visible above the frame's edge
    save(fig, "hit_rate")

    fig, axes = figure(
        "bytes_per_sample", "Network bytes per sample, by category", "bytes / sample"
    )
    series = [[s["bytes_per_sample"][c] for s in snapshots] for c in BYTE_CATEGORIES]
    axes.stackplot(steps, series, labels=[c.replace("_", " ") for c in BYTE_CATEGORIES], alpha=0.8)
    _legend_below(axes, *axes.get_legend_handles_labels())
    save(fig, "bytes_per_sample")

    fig, axes = figure(
        "ps_wait", "Time the steps waited on the parameter servers", "share of wall time (%)"
    )
    axes.plot(
        steps,
        [100 * s["ps_wait_share"] for s in snapshots],
        color="tab:red",
        label="exposed PS wait",
    )
    axes.plot(
        steps,
        [100 * s["overlapped_share"] for s in snapshots],
        color="tab:gray",
        label="PS time overlapped with compute",
    )
    axes.set_ylim(bottom=0)
    lag_axes = axes.twinx()
    lag_axes.step(
        steps,
        [s["clock_lag"] for s in snapshots],
        color="tab:purple",
        where="post",
        label="clock lag",
    )
    lag_axes.set_ylabel("clock lag of the rows used (steps)")
    lag_axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    lag_axes.set_ylim(bottom=0, top=max(1, max(s["clock_lag"] for s in snapshots)) + 0.5)
    lines = axes.get_legend_handles_labels()
    more = lag_axes.get_legend_handles_labels()
    _legend_below(axes, lines[0] + more[0], lines[1] + more[1])
    save(fig, "ps_wait")
    return paths


def _legend_below(axes, handles: list, labels: list) -> None:
    """A legend under the plot, where it hides no line."""
    axes.legend(
        handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=len(labels),
        frameon=False, fontsize="small",
    )  # fmt: skip


def write_summary(run_dir: Path, images: list[Path]) -> Path:
    """Write ``summary.md``: the headline figures, the config, and the plots; its path."""
    config, _, report = read_run(run_dir)
    wall = report["wall_s"]
    rows = [
        ("ranks", f"{report['world_size']}"),
        ("steps", f"{report['steps']}"),
        ("samples/s", f"{report['samples_per_s']:,.0f}"),
        ("final train loss", f"{report['final_train_loss']:.4f}"),
        ("held-out AUC", f"{report.get('heldout_auc', float('nan')):.4f}"),
        ("held-out log loss", f"{report.get('heldout_logloss', float('nan')):.4f}"),
        ("hot hit rate", f"{report['cache_hit_rate']:.1%}"),
        ("bytes/sample", ", ".join(
            f"{c.replace('_', ' ')} {report[f'bytes_{c}_per_sample']:,.0f}" for c in BYTE_CATEGORIES
        )),
        ("exposed PS wait", f"{report['ps_wait_s']:.1f} s of {wall:.1f} s ({report['ps_wait_s'] / wall if wall else 0:.0%})"),
        ("embedding work on this rank", f"{report.get('embedding_work_s', 0.0):.1f} s"),
        ("max clock lag", f"{report['max_clock_lag']}"),
        ("data path", f"{report['data_path']} over {report.get('transport', 'grpc')}"),
    ]  # fmt: skip
    lines = [f"# Ember training run: {run_dir.name}", "", "| figure | value |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    lines += ["", "## Plots", ""]
    lines += [f"![{image.stem}]({image.name})" for image in images] or [
        "(no plots: install matplotlib with `pip install 'ember-ps[report]'`)"
    ]
    settings = {k: v for k, v in config.items() if k not in ("endpoints", "client")}
    lines += ["", "## Config", "", "```json", json.dumps(settings, indent=2), "```", ""]
    path = run_dir / "summary.md"
    path.write_text("\n".join(lines))
    return path
