"""One trainer rank in its own process: the step pipeline over a shared counter table.

Every step reads the same ids and sends a gradient of -1 for each, on a table
with zero initial rows and SGD at learning rate 1, so (in exact mode) a row's
value is twice the number of clocks applied with 2 ranks: the value a step
reads tells which clocks it saw, independently of the reported lag.

Prints ``step T`` after each step's update is sent (so a test can act at a
known point), and writes a JSON report at the end. A slow rank sleeps in each
step's "compute".

Usage: python -m tests.support.step_rank ENDPOINTS JOB WORLD RANK STEPS STALENESS
    SLEEP_S WAIT_S TABLE REPORT
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.client.step_client import StepClient
from ember.ps_server.client.step_job import StepJob
from ember.ps_server.wire.table_spec import (
    InitializerSpec,
    InitKind,
    OptimizerKind,
    OptimizerSpec,
    TableSpec,
)
from ember.trainer.lookahead import Lookahead
from ember.trainer.pipeline import PipelinedRowSource

IDS = torch.arange(8)


def counter_table(name: str) -> TableSpec:
    """Rows start at zero and SGD at lr 1 adds the negated summed gradient."""
    return TableSpec(
        name, dim=2, initializer=InitializerSpec(InitKind.ZEROS),
        optimizer=OptimizerSpec(OptimizerKind.SGD, lr=1.0),
    )  # fmt: skip


def main(argv: list[str]) -> int:
    endpoints, job, world, rank, steps, staleness, sleep_s, wait_s, table, report = argv
    world, rank, steps, staleness = int(world), int(rank), int(steps), int(staleness)
    with PSClient(endpoints.split(",")) as client:
        client.create_table(counter_table(table))
        steps_client = StepClient(client, StepJob(job, world, rank, "exact", float(wait_s)))
        lookups, lookup = [], steps_client.lookup
        steps_client.lookup = lambda *args, **kwargs: lookups.append(1) or lookup(*args, **kwargs)
        source = PipelinedRowSource(steps_client, staleness)
        seen, started = [], time.perf_counter()
        # As train() does: lookups announced early ride on the updates they need (s <= 1),
        # planned beside the step's compute.
        ahead = Lookahead(iter(range(steps)), source.lookahead, steps,
                          lambda _: source.prefetch({table: IDS}), background=True)  # fmt: skip
        with ahead:
            while (step := ahead.take()) is not None:
                rows = source.rows({table: IDS})
                seen.append(float(rows[table][0, 0]))
                ahead.announce()
                time.sleep(float(sleep_s))  # this rank's compute
                ahead.settle()
                source.apply_gradients({table: (IDS, -torch.ones(len(IDS), 2))})
                print(f"step {step}", flush=True)
        source.flush()
        source.close()
    Path(report).write_text(
        json.dumps(
            {
                "seen": seen,
                "lookups": len(lookups),  # the step Lookup calls: the others rode on updates
                "lags": source.timing.lags,
                "exposed_wait_s": source.timing.exposed_wait,
                "rows_to_update_s": source.timing.rows_to_update_per_step,
                "wall_s": time.perf_counter() - started,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
