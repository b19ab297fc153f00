"""The exposed PS wait is the time a step is blocked on the shards, not the trainer's own
embedding work in the row source (hot rows' lookup and optimizer, splitting, placing)."""

import uuid

import pytest
import torch
from ember.ps_server.client.step_client import StepClient
from ember.ps_server.client.step_job import StepJob
from ember.ps_server.wire.table_spec import InitializerSpec, OptimizerKind, OptimizerSpec, TableSpec
from ember.trainer.cache.replicated_source import ReplicatedRowSource
from ember.trainer.embedding import PSRowSource
from ember.trainer.pipeline import PipelinedRowSource
from ember.trainer.sources import TimedSource

ROWS, DIM, TABLES, STEPS = 4000, 64, 3, 4


def _tables(client, table_name: str) -> list[TableSpec]:
    optimizer = OptimizerSpec(OptimizerKind.ADAGRAD, lr=0.05, eps=1e-8)
    specs = [
        TableSpec(f"{table_name}.t{n}", DIM, InitializerSpec(scale=0.1, seed=n), optimizer)
        for n in range(TABLES)
    ]
    for spec in specs:
        client.create_table(spec)
    return specs


def _train(source: TimedSource, specs: list[TableSpec]) -> None:
    """STEPS steps over every row of every table, as the trainer calls a source (each step's
    ids announced by a prefetch during the step before)."""
    requests = [{spec.name: torch.arange(ROWS, dtype=torch.int64) for spec in specs}]
    for step in range(STEPS):
        rows = source.rows(requests[step])
        if step + 1 < STEPS:
            requests.append({spec.name: torch.arange(ROWS, dtype=torch.int64) for spec in specs})
            with source.inside:  # as train() times its announcing
                source.prefetch(requests[step + 1])
        source.apply_gradients(
            {t: (ids, torch.full_like(rows[t], 0.01)) for t, ids in requests[step].items()}
        )


def test_a_serial_source_is_all_wait(client, table_name):
    specs = _tables(client, table_name)
    source = TimedSource(PSRowSource(client))
    _train(source, specs)
    assert source.ps_wait_s > 0
    # Every call is a round trip: what is not wait is the wrapper's own bookkeeping.
    assert source.inside.seconds - source.ps_wait_s < 0.2 * source.ps_wait_s


def test_hot_rows_stepped_on_the_trainer_are_embedding_work_not_wait(client, table_name):
    specs = _tables(client, table_name)
    steps = StepClient(client, StepJob(f"wait-{uuid.uuid4().hex}", replica=True))
    # Staleness 4: none of the 4 steps waits for an earlier update to be applied.
    cold = PipelinedRowSource(steps, staleness=4)
    every_row = {spec.name: torch.arange(ROWS, dtype=torch.int64) for spec in specs}
    replicated = ReplicatedRowSource(
        client, {s.name: s for s in specs}, every_row, writer=True, cold=cold
    )
    replicated.warm()  # setup, before the wrapper: not a step's wait
    source = TimedSource(replicated)
    flushed = False
    try:
        _train(source, specs)
        assert replicated.hits == replicated.lookups == STEPS * TABLES * ROWS
        # One rank: the replicas' lookups and optimizer steps wait for nobody. The steps
        # waited only where the cold pipeline did (for its empty lookups and updates).
        assert source.ps_wait_s == pytest.approx(cold.timing.exposed_wait, abs=1e-9)
        assert source.inside.seconds > source.ps_wait_s
        before = source.ps_wait_s
        with source.inside:
            replicated.flush(last=True)  # writing the replicas back is PS time
        flushed = True
        assert source.ps_wait_s > before
        assert source.inside.seconds >= source.ps_wait_s
    finally:
        if not flushed:
            replicated.release()  # the shards stop counting this job as a replica holder
        cold.close()
