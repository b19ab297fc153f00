"""``ember report RUN_DIR``: plots and a Markdown summary of a training run."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``report`` subcommand."""
    parser = commands.add_parser(
        "report", help="render PNG plots and a Markdown summary of a run directory"
    )
    parser.add_argument("run_dir", type=Path, help="what `ember train --run-dir` wrote")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Render, and name what was written."""
    summary = render_report(args.run_dir)
    print(f"report: {summary}")
    return 0


def render_report(run_dir: Path) -> Path:
    """The plots (where matplotlib is installed) and the summary of ``run_dir``; the summary's
    path. SystemExit naming the problem for a run directory that cannot be read."""
    from ember.trainer.run_plots import RunDirectoryError, render_plots, write_summary

    try:
        try:
            images = render_plots(run_dir)
        except ImportError:
            print("ember report: no matplotlib (pip install 'ember-ps[report]'): summary only")
            images = []
        return write_summary(run_dir, images)
    except RunDirectoryError as error:
        raise SystemExit(f"ember report: {error}") from None
