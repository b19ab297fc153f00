"""Timing shared by the benchmarks: medians of runs timed in alternation."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path


def paired_medians(runs: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median wall time of each of ``runs`` after one warm-up call each, timed in
    alternation so that drift on a shared machine hits every run alike."""
    for run in runs:
        run()
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(repeats):
        for run, samples in zip(runs, times):
            start = time.perf_counter()
            run()
            samples.append(time.perf_counter() - start)
    return [statistics.median(samples) for samples in times]


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    """Median wall time of one ``run``."""
    return paired_medians([run], repeats)[0]


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_loop(operation: Callable[[], object], budget_s: float) -> tuple[float, int]:
    """``(seconds, calls)`` of at least 3 calls filling ``budget_s``, after one warm call."""
    operation()  # warm
    count, start = 0, time.perf_counter()
    while True:
        operation()
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= budget_s and count >= 3:
            return elapsed, count


def time_per_op(operation: Callable[[], object], budget_s: float) -> float:
    """Wall seconds per call of ``operation`` over ``budget_s`` (see :func:`timed_loop`)."""
    elapsed, count = timed_loop(operation, budget_s)
    return elapsed / count
