"""The step pipeline against real shards: with staleness 0 it trains exactly as the serial path,
including when consecutive batches share most of their ids (collision rows)."""

import threading
import time
import uuid

import ember.trainer.pipeline as pipeline_module
import numpy as np
import pytest
import torch
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.client.step_client import StepClient
from ember.ps_server.client.step_job import StepJob
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.wire.table_spec import (
    InitializerSpec,
    InitKind,
    OptimizerKind,
    OptimizerSpec,
    TableSpec,
)
from ember.trainer.data.synthetic import SyntheticCriteo, SyntheticCriteoConfig
from ember.trainer.device_staging import StagedRows
from ember.trainer.embedding import PSEmbeddingBagCollection, PSRowSource
from ember.trainer.lookahead import Lookahead
from ember.trainer.models.dlrm import DLRM
from ember.trainer.pipeline import PipelinedRowSource

DIM, STEPS = 8, 30
OPTIMIZERS = {
    "sgd": OptimizerSpec(OptimizerKind.SGD, lr=0.5),
    "adagrad": OptimizerSpec(OptimizerKind.ADAGRAD, lr=0.05, eps=1e-8),
    "adam": OptimizerSpec(OptimizerKind.ADAM, lr=0.02),
}


def train_steps(
    endpoints, specs, batches, pipelined: bool, wire_dtype: str = "float32", depth: int = 0,
    client_config: ClientConfig | None = None,
):  # fmt: skip
    """Losses, final rows and traffic of STEPS steps of DLRM on ``batches``, serial or
    pipelined (with rows and gradients travelling as ``wire_dtype``; batches announced
    ``depth`` steps ahead, 0: as far as the pipeline takes them, as train() does), through
    a client of ``client_config`` (None: the defaults)."""
    torch.manual_seed(0)
    model = DLRM(13, len(specs), DIM)
    dense = torch.optim.SGD(model.parameters(), lr=0.05)
    with PSClient(endpoints, client_config) as client:
        for spec in specs:
            client.create_table(spec)
        if pipelined:
            job = StepJob(f"job-{uuid.uuid4().hex}", world=1, wait_s=60)
            steps = StepClient(client, job, {spec.name: wire_dtype for spec in specs})
            source = PipelinedRowSource(steps, staleness=0)
            lookups = count_calls(steps, "lookup")
            updates = count_calls(steps, "update_and_read")
        else:
            source = PSRowSource(client)
        ebc = PSEmbeddingBagCollection(source, [s.name for s in specs])

        def plan(upcoming):
            if pipelined:
                # Slower than the step's small model: an update sent before its planning
                # settled would leave without the reads it must carry.
                time.sleep(0.005)
                ebc.prefetch(upcoming.sparse)

        losses = []
        with Lookahead(  # as train() does: planned beside the step's compute
            iter(batches), depth or getattr(source, "lookahead", 1), len(batches), plan,
            background=pipelined,
        ) as ahead:  # fmt: skip
            while (batch := ahead.take()) is not None:
                dense.zero_grad()
                pooled = ebc(batch.sparse)
                ahead.announce()
                loss = torch.nn.functional.binary_cross_entropy_with_logits(
                    model(batch.dense, pooled), batch.labels
                )
                loss.backward()
                dense.step()
                ahead.settle()
                ebc.step()
                losses.append(loss.item())
        if pipelined:
            source.flush()
            assert source.timing.max_lag == 0 and len(source.timing.lags) == len(batches)
            # Announced two steps ahead, every lookup but steps 0's and 1's rides on an update.
            assert len(lookups) == (2 if (depth or source.lookahead) == 2 else len(batches))
            # With float32 rows riding on updates, the collision rows are stepped here: only
            # the update of clock 0 (step 1's rows came by a lookup) asks for a refresh.
            refreshing = sum(1 for args in updates if args[2])
            stepped_here = wire_dtype == "float32" and not depth
            assert refreshing == (1 if stepped_here else len(batches) - 1)
            source.close()
        rows = {
            s.name: client.pull_with_versions(s.name, torch.arange(c)) for s, c in specs.items()
        }
    return losses, rows, source.traffic


def count_calls(target, name: str) -> list:
    """The arguments of every call of ``target.name`` from now on (it still runs)."""
    calls, method = [], getattr(target, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return method(*args, **kwargs)

    setattr(target, name, counted)
    return calls


@pytest.mark.parametrize(
    "optimizer,ids,depth",
    [(optimizer, ids, 0) for optimizer in OPTIMIZERS for ids in ("spread", "colliding")]
    + [("adam", "colliding", 1)],  # lookups that start on their own, none riding
)
def test_the_pipeline_with_staleness_0_trains_exactly_as_the_serial_path(
    table_name, optimizer, ids, depth
):
    cardinalities = (40, 300, 2000, 7) if ids == "spread" else (3, 5, 4, 2)  # nearly all collide
    specs = {
        TableSpec(f"{table_name}.f{f}", DIM, InitializerSpec(scale=0.1, seed=4), OPTIMIZERS[optimizer]): c
        for f, c in enumerate(cardinalities)
    }  # fmt: skip
    data = SyntheticCriteo(SyntheticCriteoConfig(cardinalities=cardinalities, seed=3))
    batches = [data.batch(64, index) for index in range(STEPS)]
    results = []
    for pipelined in (False, True):
        with LocalCluster(2) as cluster:  # same table names, fresh rows
            results.append(train_steps(cluster.endpoints, specs, batches, pipelined, depth=depth))
    (serial_losses, serial_rows, _), (piped_losses, piped_rows, _) = results
    # Bit for bit: the shards and the trainer (stepping the collision rows itself) run one
    # native kernel, and every row is stepped from the same values in the same order.
    assert piped_losses == serial_losses
    for name, (rows, versions) in serial_rows.items():
        assert torch.equal(piped_rows[name][1], versions)
        assert torch.equal(piped_rows[name][0], rows), name
    if ids == "colliding":
        assert max(v.max() for _, v in serial_rows.values()) == STEPS  # rows every step touched


def test_bfloat16_on_the_wire_trains_close_to_float32_with_half_the_row_bytes(table_name):
    cardinalities = (3, 5, 400, 2)  # colliding rows: prefetches patched with bfloat16 refreshes
    specs = {
        TableSpec(f"{table_name}.f{f}", DIM, InitializerSpec(scale=0.1, seed=4), OPTIMIZERS["adagrad"]): c
        for f, c in enumerate(cardinalities)
    }  # fmt: skip
    data = SyntheticCriteo(SyntheticCriteoConfig(cardinalities=cardinalities, seed=3))
    batches = [data.batch(64, index) for index in range(STEPS)]
    runs = {}
    # Lookups and refreshes both ways (depth 1), so that the same rows travel in each: with
    # float32 and reads riding on updates the trainer steps its collision rows itself.
    for wire_dtype, depth in (("float32", 1), ("bfloat16", 1), ("riding", 0)):
        with LocalCluster(2) as cluster:
            runs[wire_dtype] = train_steps(
                cluster.endpoints, specs, batches, True, wire_dtype.replace("riding", "bfloat16"),
                depth=depth,
            )  # fmt: skip
    # bfloat16 reads riding on updates, patched by bfloat16 refreshes: the same rows exactly
    assert runs.pop("riding")[0] == runs["bfloat16"][0]
    (full_losses, full_rows, full), (narrow_losses, narrow_rows, narrow) = runs.values()
    np.testing.assert_allclose(narrow_losses, full_losses, rtol=0, atol=5e-3)
    assert not np.allclose(narrow_losses, full_losses, rtol=0, atol=1e-7)  # rounding did happen
    # The same rows stepped as often. Their values part a little more than the losses do
    # (Adagrad's first steps are about lr * sign(g), and rounding can flip a gradient near
    # 0); test_wire_dtypes checks each packed update against float64 exactly.
    for name, (_, versions) in full_rows.items():
        assert torch.equal(narrow_rows[name][1], versions)
    assert (narrow.rows_pulled, narrow.rows_pushed) == (full.rows_pulled, full.rows_pushed)
    row_bytes = 4 * DIM * (full.rows_pulled + full.rows_pushed)
    saved = full.bytes_pulled + full.bytes_pushed - (narrow.bytes_pulled + narrow.bytes_pushed)
    assert saved == row_bytes // 2
    # control bytes (clocks, names, positions, framing) are the same but for the dtype fields
    # and shorter length prefixes: at most 16 bytes per table, shard and step
    assert abs(narrow.bytes_control - full.bytes_control) <= 16 * 2 * STEPS * len(specs)


def test_rows_that_no_prefetch_asked_for_still_include_the_previous_step(cluster, table_name):
    spec = TableSpec(table_name, DIM, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=1.0))
    ids = torch.tensor([1, 2])
    with PSClient(cluster.endpoints) as client:
        client.create_table(spec)
        initial = client.pull(table_name, ids)
        steps = StepClient(client, StepJob(f"job-{uuid.uuid4().hex}", world=1, wait_s=60))
        source = PipelinedRowSource(steps, staleness=0)
        source.rows({table_name: ids})
        source.prefetch({table_name: torch.tensor([5])})  # the plan changes after this
        source.apply_gradients({table_name: (ids, torch.ones(2, DIM))})
        rows = source.rows({table_name: ids})[table_name]
        torch.testing.assert_close(rows, initial - 1.0, rtol=0, atol=1e-6)
        assert source.timing.lags == [0, 0]
        source.flush()
        source.close()


def test_a_failed_update_surfaces_at_the_next_wait_not_after_the_lookup_it_stalls(
    cluster, table_name
):
    """Staleness 1: step 2's lookup needs clock 0. If clock 0's update fails while that
    lookup waits, it can never be answered; the step raises the update's error at once, not
    the lookup's DEADLINE_EXCEEDED a minute later."""
    spec = TableSpec(table_name, DIM, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=1.0))
    ids = {table_name: torch.tensor([1, 2])}
    with PSClient(cluster.endpoints) as client:
        client.create_table(spec)
        steps = StepClient(client, StepJob(f"job-{uuid.uuid4().hex}", world=1, wait_s=60))
        send, clock_0_leaves = steps.update_and_read, threading.Event()

        def update(updates, clock, *asked):
            if clock == 0:
                assert clock_0_leaves.wait(timeout=60)
            return send(updates, clock, *asked)

        steps.update_and_read = update
        source = PipelinedRowSource(steps, staleness=1)
        source.rows(ids)
        source.prefetch(ids)
        source.apply_gradients({table_name: (ids[table_name], torch.ones(2, DIM + 1))})
        source.rows(ids)
        source.prefetch(ids)  # asks for clock 0
        source.apply_gradients({table_name: (ids[table_name], torch.ones(2, DIM))})
        clock_0_leaves.set()  # and fails: its gradients have the wrong width
        started = time.perf_counter()
        with pytest.raises(ValueError, match="grads must have shape"):
            source.rows(ids)
        assert time.perf_counter() - started < 20
    source.close()  # the client's close ended the calls still waiting on the shards


@pytest.mark.parametrize("step_1_updates", ["other ids", "the announced ids"])
def test_a_read_too_large_to_ride_with_its_update_comes_by_a_lookup_of_the_clock(
    table_name, step_1_updates
):
    """Staleness 0: the update of clock 0 carries step 1's refresh and step 2's read. Under a
    64 KiB message limit each answer fits alone but not both in one: the shard refuses before
    applying, and the pipeline sends the update alone, then the read as a lookup (with no
    state: step 2's rows shared with step 1 are refreshed, not stepped here)."""
    spec = TableSpec(table_name, 4, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=1.0))
    ids, touched = torch.arange(1800), torch.arange(10)
    with (
        LocalCluster(1, ["--max-message-bytes", str(1 << 16)]) as cluster,
        PSClient(cluster.endpoints) as client,
    ):
        client.create_table(spec)
        initial = client.pull(table_name, ids)
        steps = StepClient(client, StepJob(f"job-{uuid.uuid4().hex}", world=1, wait_s=60))
        lookups = count_calls(steps, "lookup")
        source = PipelinedRowSource(steps, staleness=0)
        source.rows({table_name: touched})
        requests = [{table_name: ids}, {table_name: ids}]
        for request in requests:  # steps 1 (a lookup now) and 2 (riding on clock 0)
            source.prefetch(request)
        expected = initial.clone()
        for step, request in enumerate(requests, 1):
            pushed = ids if step == 2 and step_1_updates == "the announced ids" else touched
            source.apply_gradients({table_name: (pushed, torch.ones(len(pushed), 4))})
            rows = source.rows(request)[table_name]
            expected[pushed] -= 1.0  # SGD, lr 1: every clock before this step, no other
            torch.testing.assert_close(rows, expected, rtol=0, atol=1e-6)
        assert len(lookups) == 3  # steps 0 and 1, and the read that could not ride
        source.flush()
        source.close()


@pytest.mark.parametrize(
    "announced,served,later",
    [([1, 2], [5], [2, 3]), ([1], [2], [2, 3])],  # shares id 2 as announced; shares nothing
)
def test_a_step_served_other_ids_than_announced_leaves_the_shared_rows_to_a_refresh(
    cluster, table_name, announced, served, later
):
    """Step 2's read rides on clock 0 with the state of the rows it shares with step 1's
    announced ids; step 1 then reads and updates other ids, so stepping rows here would
    miss or misapply its gradient: the update of clock 1 asks for a refresh instead."""
    spec = TableSpec(table_name, DIM, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=1.0))
    announced, served, later = map(torch.tensor, (announced, served, later))
    with PSClient(cluster.endpoints) as client:
        client.create_table(spec)
        initial = client.pull(table_name, later)
        steps = StepClient(client, StepJob(f"job-{uuid.uuid4().hex}", world=1, wait_s=60))
        updates = count_calls(steps, "update_and_read")
        source = PipelinedRowSource(steps, staleness=0)
        source.rows({table_name: announced})
        source.prefetch({table_name: announced})  # step 1, as announced
        source.prefetch({table_name: later})  # step 2: rides on clock 0, shares id 2
        source.apply_gradients({table_name: (announced, torch.ones(len(announced), DIM))})
        source.rows({table_name: served})  # step 1 reads other ids after all
        source.apply_gradients({table_name: (served, torch.ones(1, DIM))})
        rows = source.rows({table_name: later})[table_name]
        expected = initial.clone()
        for clock_ids in (announced, served):  # SGD, lr 1: each clock takes 1 off its rows
            expected[torch.isin(later, clock_ids)] -= 1.0
        torch.testing.assert_close(rows, expected, rtol=0, atol=1e-6)
        assert [bool(args[2]) for args in updates] == [True, True]  # both refreshed
        source.flush()
        source.close()


class RecordingStaging:
    """DeviceStaging's stand-in: a copy of each arrival, under a token ``take`` must see once
    (rows served without passing ``take`` would be the token's tuple, not rows)."""

    def __init__(self, device):
        self.device, self.staged, self.taken = str(device), [], []

    def stage(self, rows):
        token = object()
        self.staged.append(token)
        return StagedRows({t: part.clone() for t, part in rows.items()}, token)

    def take(self, staged):
        assert staged.ready in self.staged and staged.ready not in self.taken
        self.taken.append(staged.ready)
        return staged.rows


def counter_table(name: str) -> TableSpec:
    """Rows start at zero and SGD at lr 1 subtracts each step's gradient of ones."""
    return TableSpec(
        name, DIM, InitializerSpec(InitKind.ZEROS), OptimizerSpec(OptimizerKind.SGD, lr=1.0)
    )


@pytest.mark.parametrize("staleness", [0, 1])
def test_every_step_takes_its_rows_through_the_staging_once(
    cluster, table_name, staleness, monkeypatch
):
    """Rows come by a lookup (steps 0 and 1) or riding on an update (later ones); each step's
    pass through the device staging, staged on the thread that received them and taken on
    the training thread. Staleness 0 patches and steps rows on the host: it stages on the
    host, and the rows it steps are the ones served, even where staging copies them."""
    made = []
    monkeypatch.setattr(
        pipeline_module,
        "DeviceStaging",
        lambda device: made.append(RecordingStaging(device)) or made[-1],
    )
    steps_run, ids = 8, {table_name: torch.tensor([1, 2, 3])}
    with PSClient(cluster.endpoints) as client:
        client.create_table(counter_table(table_name))
        steps = StepClient(client, StepJob(f"job-{uuid.uuid4().hex}", world=1, wait_s=60))
        source = PipelinedRowSource(steps, staleness, device="cuda")  # the stand-in's only
        with Lookahead(
            iter(range(steps_run)), source.lookahead, steps_run, lambda _: source.prefetch(ids),
            background=True,
        ) as ahead:  # fmt: skip
            while (step := ahead.take()) is not None:
                rows = source.rows(ids)[table_name]
                # Every step before step - staleness - 1 applied (a row is minus its updates).
                newest, oldest = -float(step), -float(max(0, step - staleness))
                assert rows.shape == (3, DIM) and bool(((rows >= newest) & (rows <= oldest)).all())
                ahead.announce()
                ahead.settle()
                source.apply_gradients({table_name: (ids[table_name], torch.ones(3, DIM))})
        source.flush()
        source.close()
    (staging,) = made
    assert staging.device == ("cuda" if staleness else "cpu")
    assert len(staging.taken) == steps_run  # every step's rows, each arrival once
    assert len(staging.staged) >= steps_run
