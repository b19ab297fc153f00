"""The exposed PS wait is the time a step is blocked on the shards, not the trainer's own
embedding work in the row source (hot rows' lookup and optimizer, splitting, placing)."""

import uuid

import torch
from ember.ps_server.client.step_client import StepClient, StepJob
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
    """STEPS steps over every row of every table, as the trainer calls a source."""
    ids = torch.arange(ROWS, dtype=torch.int64)
    for _ in range(STEPS):
        rows = source.rows({spec.name: ids for spec in specs})
        grads = {spec.name: (ids, torch.full_like(rows[spec.name], 0.01)) for spec in specs}
        source.apply_gradients(grads)


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
    try:
        _train(source, specs)
        assert replicated.hits == replicated.lookups == STEPS * TABLES * ROWS
        # The steps' time in the source is the replicas' lookups and optimizer steps; the
        # cold pipeline has nothing to fetch and no earlier update to wait for.
        assert source.inside.seconds > 0
        assert source.ps_wait_s < 0.5 * source.inside.seconds
        before = source.ps_wait_s
        with source.inside:
            replicated.flush(last=True)  # writing the replicas back is PS time
        assert source.ps_wait_s > before
    finally:
        cold.close()
