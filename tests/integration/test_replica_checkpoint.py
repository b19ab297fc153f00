"""A checkpoint taken while ranks train hot-row replicas holds what they hold: the ranks
write their replicas back after one step and wait until writes are paused, so the
checkpoint's hot and cold rows are both those of that step (see FlushReplicas in the .proto).
"""

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.client.shard_rpc import ShardCall
from ember.ps_server.client.step_client import StepClient
from ember.ps_server.client.step_job import StepJob
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.durability.checkpoint_coordinator import take_checkpoint
from ember.ps_server.durability.recovery import recover
from ember.ps_server.errors import PSClientError, Status
from ember.ps_server.shard.config import ShardConfig
from ember.ps_server.shard.server import ParameterServer
from ember.ps_server.wire.messages import encode_ids, pb
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec
from ember.trainer.config import TrainConfig
from ember.trainer.train import synthetic_data, table_specs

from ember.deploy.topology import train_argv
from tests.support.union_reference import pretrained_tables, union_reference

STEPS = 16


def restored(directory) -> ParameterServer:
    """A one-shard server holding every row of a checkpoint."""
    server = ParameterServer(0, 1)
    recover(server, ShardConfig(restore=str(directory)))
    return server


def restored_rows(server: ParameterServer, spec: TableSpec, size: int):
    """Rows, optimizer state and versions of ids 0..size-1 of a restored checkpoint."""
    reply = server.pull(spec.name, encode_ids(np.arange(size, dtype=np.int64)), with_state=True)
    return torch.from_numpy(reply.values), torch.from_numpy(reply.state), reply.versions


def cut_step(directory) -> int:
    """Steps of the (only) training job a checkpoint holds, from its clock cut."""
    applied = {
        tuple(job["applied"])
        for path in directory.glob("shard-*.meta.json")
        for job in json.loads(path.read_text())["step_clocks"].values()
    }
    assert len(applied) <= 1 and all(len(set(clocks)) == 1 for clocks in applied), applied
    return applied.pop()[0] + 1 if applied else 0


def train_while_checkpointing(config, cluster, root, tmp_path, extra=()) -> list:
    """Two ranks under torchrun train ``config`` while checkpoints are taken back to back
    under ``root``; returns their directories once the ranks have ended well."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "-m", "ember.cli.main", "train", *train_argv(config), "--no-progress",
        "--device", "cpu", "--eval-batches", "1", *extra,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(tmp_path / "trainers.log", "wb") as log:
        trainers = subprocess.Popen(command, env=env, stdout=log, stderr=log)
        directories = []
        with PSClient(cluster.endpoints) as coordinator:
            deadline = time.monotonic() + 240
            while trainers.poll() is None and time.monotonic() < deadline:
                try:
                    directories.append(coordinator.checkpoint(root))
                except PSClientError as refused:
                    # A job whose first update lands between the flush request and the
                    # pause is refused, as designed ("retry it"); anything else fails.
                    if "did not write them back" not in refused.details:
                        raise
        code = trainers.wait(timeout=120)
    assert code == 0, (tmp_path / "trainers.log").read_text()[-3000:]
    return directories


def test_checkpoints_taken_while_two_replica_ranks_train_hold_one_step_of_every_row(
    tmp_path, table_name
):
    """Checkpoints back to back while two ranks train (hot rows replicated, cold rows through
    the step pipeline): each one equals one process on the union of the ranks' batches after
    the step of its clock cut, hot and cold rows, optimizer state and versions alike."""
    root = tmp_path / "ckpt"
    with LocalCluster(2, extra_args=["--checkpoint-root", str(root)]) as cluster:
        config = TrainConfig(
            endpoints=tuple(cluster.endpoints), steps=STEPS, batch_size=64, max_cardinality=300,
            optimizer="adagrad", sparse_lr=0.05, dense_lr=0.05, dim=8, table_prefix=table_name,
            cache="replicated", cache_mb=0.05, profile_batches=4,
        )  # fmt: skip
        data = synthetic_data(config)
        specs = table_specs(config, data.num_features)
        sizes = data.config.cardinalities
        with PSClient(cluster.endpoints) as client:
            start = pretrained_tables(client, specs, sizes)
        directories = train_while_checkpointing(
            config, cluster, root, tmp_path, ["--report", str(tmp_path / "report.json")]
        )
    report = json.loads((tmp_path / "report.json").read_text())
    assert 0.2 < report["cache_hit_rate"] < 1.0  # hot rows and cold rows both
    _, after = union_reference(config, data, specs, start)
    by_step: dict[int, list] = {}
    for directory in directories:
        by_step.setdefault(cut_step(directory), []).append(directory)
    assert len([step for step in by_step if 0 < step < STEPS]) >= 2, by_step  # mid-run
    checked = [(step, d) for step, ds in sorted(by_step.items()) for d in {ds[0], ds[-1]}]
    for step, directory in checked:  # the first and the last of each step
        server = restored(directory)
        for feature, (spec, size) in enumerate(zip(specs, sizes)):
            rows, state, versions = restored_rows(server, spec, size)
            weights, moments, held = after[step][feature]
            where = f"{directory.name} (step {step}), {spec.name}"
            assert torch.equal(torch.from_numpy(versions), held), where
            torch.testing.assert_close(rows, weights, rtol=1e-4, atol=1e-5, msg=where)
            torch.testing.assert_close(state, moments, rtol=1e-4, atol=1e-6, msg=where)


# Steps of the async run: enough that checkpoints taken back to back land mid-run at two
# steps at least, even when a loaded machine slows the checkpoints more than the steps (12
# steps once gave checkpoints at one step only, in CI on two workers).
ASYNC_STEPS = 30


def test_checkpoints_taken_while_two_async_replica_ranks_train_each_hold_one_step(
    tmp_path, table_name
):
    """Async mode, staleness 1 (each rank's updates are applied on their own): every
    checkpoint succeeds, with every rank at the same clock. (The ranks meet at a barrier
    before the write-back is reported; this run does not lose the race without it, so it
    does not prove that barrier.)"""
    root = tmp_path / "ckpt"
    with LocalCluster(2, extra_args=["--checkpoint-root", str(root)]) as cluster:
        config = TrainConfig(
            endpoints=tuple(cluster.endpoints), steps=ASYNC_STEPS, batch_size=64,
            max_cardinality=300, dim=8, table_prefix=table_name, cache="replicated",
            cache_mb=0.05, profile_batches=4, staleness=1, update_mode="async",
        )  # fmt: skip
        with PSClient(cluster.endpoints) as client:  # every shard has every table first
            for spec in table_specs(config, synthetic_data(config).num_features):
                client.create_table(spec)
        directories = train_while_checkpointing(config, cluster, root, tmp_path)
    steps = [cut_step(directory) for directory in directories]  # asserts ranks agree
    assert len({step for step in steps if 0 < step < ASYNC_STEPS}) >= 2, steps


SPEC = TableSpec("emb", dim=4, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=1.0))


def _replica_job(client: PSClient, name: str) -> StepClient:
    """A replica job that has sent clock 0 (so every shard counts it) and then stopped."""
    steps = StepClient(client, StepJob(name, replica=True, wait_s=30))
    steps.update({"emb": (torch.arange(4), torch.ones(4, 4))}, clock=0)
    return steps


def test_a_replica_job_that_never_flushes_fails_the_checkpoint_until_released(tmp_path):
    root = tmp_path / "ckpt"
    with (
        LocalCluster(2, extra_args=["--checkpoint-root", str(root)]) as cluster,
        PSClient(cluster.endpoints) as client,
    ):
        client.create_table(SPEC)
        _replica_job(client, "job-silent")
        started = time.monotonic()
        with pytest.raises(PSClientError) as refused:
            client.checkpoint(root, flush_wait_s=0.5)
        assert refused.value.code == Status.DEADLINE_EXCEEDED
        assert "job-silent" in str(refused.value) and "--release-job" in str(refused.value)
        assert time.monotonic() - started < 10
        assert not list(root.glob("*/manifest.json"))  # nothing that claims to be complete
        client.push("emb", torch.arange(4), torch.ones(4, 4))  # writes were resumed
        directory = client.checkpoint(root, flush_wait_s=0.5, release=["job-silent"])
        assert (directory / "manifest.json").exists() and cut_step(directory) == 1
        assert client.checkpoint(root, flush_wait_s=0.5)  # released for good


def _flush_request_becomes(steps: StepClient, wanted: str, first_clock: int) -> int:
    """Send updates until their replies ask for ``wanted`` (for at most 20 s); the next clock."""
    started, clock = time.monotonic(), first_clock
    while time.monotonic() - started < 20:
        steps.update({"emb": (torch.arange(4), torch.ones(4, 4))}, clock=clock)
        clock += 1
        if steps.flush_request == wanted:
            return clock
    raise AssertionError(f"the shard asks for {steps.flush_request!r}, not {wanted!r}")


def test_a_checkpoint_whose_coordinator_went_away_stops_asking_replica_jobs(tmp_path):
    """A shard watches FlushReplicas' caller: once it is gone (here its client closed, long
    before the flush's own 60 s wait), replica jobs are no longer asked to write back."""
    with (
        LocalCluster(1, extra_args=["--checkpoint-root", str(tmp_path)]) as cluster,
        PSClient(cluster.endpoints) as client,
    ):
        client.create_table(SPEC)
        steps = _replica_job(client, "job-asked")
        coordinator = PSClient(cluster.endpoints)
        request = pb.FlushReplicasRequest(flush_id="flush-gone", wait_ms=60_000)
        failures = []

        def ask() -> None:
            try:
                coordinator.shard_rpc.run([ShardCall(0, "FlushReplicas", request)])
            except PSClientError as error:
                failures.append(error)

        asking = threading.Thread(target=ask)
        try:
            asking.start()
            clock = _flush_request_becomes(steps, "flush-gone", 1)
        finally:
            coordinator.close()
        asking.join(30)
        assert [f.code for f in failures] == [Status.CANCELLED], failures
        _flush_request_becomes(steps, "", clock)


def test_a_job_that_releases_its_replicas_is_not_waited_for(tmp_path):
    root = tmp_path / "ckpt"
    with (
        LocalCluster(2, extra_args=["--checkpoint-root", str(root)]) as cluster,
        PSClient(cluster.endpoints) as client,
    ):
        client.create_table(SPEC)
        steps = _replica_job(client, "job-done")
        assert steps.replicas_flushed("", clock=0, release=True) is False
        directory = client.checkpoint(root, flush_wait_s=0.5)
        assert cut_step(directory) == 1


class _AfterFlush:
    """The coordinator's RPCs, with ``action`` run between FlushReplicas and PauseWrites."""

    def __init__(self, rpc, action) -> None:
        self.rpc, self.endpoints, self._action = rpc, rpc.endpoints, action

    def run(self, calls, on_reply=None, restart_patience_s=None):
        replies = self.rpc.run(calls, on_reply, restart_patience_s)
        if calls[0].method == "FlushReplicas":
            self._action()
        return replies


def _report_when_asked(steps: StepClient, wait_s: float = 30) -> None:
    """The job's write-back report at clock 0 once a checkpoint asks for it (held up to
    ``wait_s``)."""
    deadline, answered = time.monotonic() + 30, steps.flush_request
    while steps.flush_request in ("", answered) and time.monotonic() < deadline:
        steps.update({}, clock=0)  # a duplicate of clock 0: only asks what the shards want
    reporter = StepClient(steps.client, StepJob(steps.job.name, replica=True, wait_s=wait_s))
    reporter.replicas_flushed(steps.flush_request, clock=0)


def _step(steps: StepClient, clock: int) -> None:
    steps.update({"emb": (torch.arange(4), torch.ones(4, 4))}, clock=clock)


def test_a_job_that_goes_on_after_its_flush_fails_the_checkpoint(tmp_path):
    """Its report came back unheld (as if its hold had run out) and it took clock 1 before
    the pause: its hot rows would be of clock 0, its other rows of clock 1."""
    root = tmp_path / "ckpt"
    with (
        LocalCluster(2, extra_args=["--checkpoint-root", str(root)]) as cluster,
        PSClient(cluster.endpoints) as client,
    ):
        client.create_table(SPEC)
        steps = _replica_job(client, "job-eager")
        reporter = threading.Thread(target=_report_when_asked, args=(steps, 0.001))
        reporter.start()
        with pytest.raises(PSClientError) as refused:
            take_checkpoint(_AfterFlush(client.shard_rpc, lambda: _step(steps, 1)), root)
        reporter.join(30)
        assert refused.value.code == Status.FAILED_PRECONDITION
        assert "job-eager" in str(refused.value) and "after clock 0" in str(refused.value)
        assert not list(root.glob("*/manifest.json"))


def test_a_job_that_starts_after_the_request_fails_the_checkpoint(tmp_path):
    """No shard asked it (it was not a replica job yet), and it applied a clock before the
    pause: the checkpoint would hold its cold rows of that clock without its hot rows."""
    root = tmp_path / "ckpt"
    with (
        LocalCluster(2, extra_args=["--checkpoint-root", str(root)]) as cluster,
        PSClient(cluster.endpoints) as client,
    ):
        client.create_table(SPEC)
        with pytest.raises(PSClientError) as refused:
            take_checkpoint(
                _AfterFlush(client.shard_rpc, lambda: _replica_job(client, "late")), root
            )
        assert refused.value.code == Status.FAILED_PRECONDITION
        assert "'late'" in str(refused.value) and "did not write them back" in str(refused.value)
        assert client.checkpoint(root, flush_wait_s=0.5, release=["late"])  # a retry works


def test_checkpoint_ids_repeated_under_two_roots_ask_for_a_new_flush_each(tmp_path):
    """Both roots start at the same checkpoint id; the job must still be asked twice."""
    with (
        LocalCluster(2, extra_args=["--checkpoint-root", str(tmp_path)]) as cluster,
        PSClient(cluster.endpoints) as client,
    ):
        client.create_table(SPEC)
        steps = _replica_job(client, "job-twice")
        directories = []
        for root in (tmp_path / "a", tmp_path / "b"):
            reporter = threading.Thread(target=_report_when_asked, args=(steps,))
            reporter.start()
            directories.append(client.checkpoint(root, flush_wait_s=30))
            reporter.join(30)
        assert [d.name for d in directories] == [directories[0].name] * 2


def test_which_jobs_hold_replicas_survives_a_restart_and_a_restore(tmp_path):
    """The write-ahead log and checkpoints record which jobs hold replicas and which released
    them: a restarted shard still waits for a job that holds some (it would otherwise take
    its cold rows without its hot rows), and still refuses a released one."""
    root = tmp_path / "ckpt"
    args = ["--checkpoint-root", str(root), "--wal", str(tmp_path / "wal")]
    with LocalCluster(1, extra_args=args) as cluster, PSClient(cluster.endpoints) as client:
        client.create_table(SPEC)
        held = _replica_job(client, "held")
        done = _replica_job(client, "done")
        assert done.replicas_flushed("", clock=0, release=True) is False
        cluster.kill_shard(0)
        cluster.restart_shard(0)  # replays the log
        with pytest.raises(PSClientError) as refused:
            client.checkpoint(root, flush_wait_s=0.5)
        assert refused.value.code == Status.DEADLINE_EXCEEDED
        assert "held" in str(refused.value) and "done" not in str(refused.value)
        with pytest.raises(PSClientError) as again:
            _step(done, 1)
        assert again.value.code == Status.FAILED_PRECONDITION
        assert "released its hot-row replicas" in str(again.value)
        reporter = threading.Thread(target=_report_when_asked, args=(held,))
        reporter.start()
        directory = client.checkpoint(root, flush_wait_s=30)
        reporter.join(30)
    restored = ParameterServer(0, 1)
    recover(restored, ShardConfig(restore=str(directory)))
    assert restored.steps.replicas.jobs() == ["held"]
    assert restored.steps.replicas.snapshot()["released"] == ["done"]
