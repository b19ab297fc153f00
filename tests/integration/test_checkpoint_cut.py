"""A checkpoint taken while a job's clocks are in flight holds one clock cut on every shard:
each shard applies the clocks up to the cut, and no later ones, before it writes."""

import threading
import time

import numpy as np
import pytest
import torch
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.client.shard_rpc import ShardCall
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.durability.checkpoint_coordinator import clock_cut, take_checkpoint
from ember.ps_server.durability.checkpoint_format import Manifest
from ember.ps_server.durability.recovery import recover
from ember.ps_server.durability.write_log import WriteLog
from ember.ps_server.errors import (
    CheckpointStateError,
    ClockTooLargeError,
)
from ember.ps_server.routing import shard_of
from ember.ps_server.shard.config import ShardConfig
from ember.ps_server.shard.initializers import initial_rows
from ember.ps_server.shard.server import ParameterServer
from ember.ps_server.shard.step_clocks import StepClocks
from ember.ps_server.wire.messages import encode_ids, pb
from ember.ps_server.wire.step_codec import (
    StepClockView,
    decode_update_request,
    encode_update_request,
)

from tests.support.clock_cut import (
    IDS,
    JOB,
    SPEC,
    applied_in_meta,
    grads,
    in_threads,
    update_request,
    write_c1_in_thread,
)


def test_a_paused_shard_applies_up_to_the_cut_and_holds_later_clocks(tmp_path):
    server = ParameterServer(0, 1, checkpoint_root=str(tmp_path))
    server.create_table(SPEC)

    def send(clock: int, rank: int):
        return lambda: server.steps.update(decode_update_request(update_request(clock, rank)))

    server.checkpoints.pause("c1", 60)
    threads = in_threads(send(0, 0), send(0, 1), send(1, 0), send(1, 1))  # all held at first
    files, specs = server.checkpoints.write("c1", str(tmp_path / "c1"), "", cut={JOB: [0, 0]})
    Manifest("c1", None, 1, specs, {0: files}).write(tmp_path / "c1")
    for thread in threads:
        thread.join(30)
    assert applied_in_meta(tmp_path / "c1", 0, 1) == [0, 0]  # clock 1 waited for the write
    assert server.steps.clocks.snapshot()[JOB]["applied"] == [1, 1]  # and went on after it
    restored = ParameterServer(0, 1)
    recover(restored, ShardConfig(restore=str(tmp_path / "c1")))
    initial = initial_rows(SPEC, IDS).numpy()
    after_clock_0 = initial - grads(0, 0) - grads(0, 1)  # SGD, lr 1, the ranks' sum
    values = np.asarray(restored.pull("emb", encode_ids(IDS)).values).reshape(len(IDS), 4)
    np.testing.assert_allclose(values, after_clock_0)


def test_a_cut_the_shard_cannot_reach_refuses_within_the_lease(tmp_path):
    server = ParameterServer(0, 1, checkpoint_root=str(tmp_path))
    server.create_table(SPEC)
    server.checkpoints.pause("c1", 0.5)
    (rank0,) = in_threads(
        lambda: server.steps.update(decode_update_request(update_request(0, 0)))
    )  # rank 1 never delivers clock 0
    with pytest.raises(CheckpointStateError, match=r"clock cut \{'job-cut': \[0, 0\]\}"):
        server.checkpoints.write("c1", str(tmp_path / "c1"), "", cut={JOB: [0, 0]})
    assert not (tmp_path / "c1").exists()  # nothing written
    server.steps.update(decode_update_request(update_request(0, 1)))  # writes flow again
    rank0.join(30)
    assert server.steps.clocks.snapshot()[JOB]["applied"] == [0, 0]


def _refuse_clock_0(server: ParameterServer) -> None:
    """Both ranks send clock 0, which is too large to log here: both are refused."""
    errors = []

    def rank_0() -> None:
        try:
            server.steps.update(decode_update_request(update_request(0, 0)))
        except ClockTooLargeError as error:
            errors.append(error)

    (rank0,) = in_threads(rank_0)
    with pytest.raises(ClockTooLargeError):
        server.steps.update(decode_update_request(update_request(0, 1)))
    rank0.join(30)
    assert len(errors) == 1


@pytest.mark.parametrize("refused", ["before the pause", "while the checkpoint waits"])
def test_a_cut_past_a_clock_this_shard_refused_fails_at_once_naming_it(tmp_path, refused):
    """A clock too large to log here, which another shard applied, splits the job: the
    cut can never be reached, so the checkpoint fails at once, and lets writes go, instead
    of at its lease."""
    server = ParameterServer(0, 1, checkpoint_root=str(tmp_path))
    server.create_table(SPEC)
    write_log = WriteLog(tmp_path / "wal", 0, 1, "always")
    write_log.claim()
    write_log.open()
    server.journal.log = write_log
    server.steps.max_logged_clock_bytes = 100  # under the clock's two ranks of rows
    try:
        if refused == "before the pause":
            _refuse_clock_0(server)
        server.checkpoints.pause("c1", 300)
        started = time.monotonic()
        writer, failures = write_c1_in_thread(server, tmp_path)
        if refused == "while the checkpoint waits":
            assert server.gate.await_admitting(30)
            _refuse_clock_0(server)
        writer.join(60)
        assert time.monotonic() - started < 60  # not the lease's 300 s
        assert len(failures) == 1
        assert "can never reach the clock cut" in str(failures[0]) and JOB in str(failures[0])
        server.checkpoints.pause("c2", 300)  # c1 let go of the gate
        server.checkpoints.write("c2", str(tmp_path / "c2"), "", cut={JOB: [-1, -1]})
    finally:
        write_log.close()


def _update_of_one_rank(server: ParameterServer) -> None:
    """Clock 0 of JOB as a job of one rank (the cut's rank 0, clock 0: a pause admits it)."""
    one_rank = StepClockView(JOB, 1, 0, 0, pb.EXACT, 30_000)
    request = encode_update_request([("emb", encode_ids(IDS), grads(0, 0))], one_rank)
    server.steps.update(decode_update_request(request))


@pytest.mark.parametrize("known", ["before", "during the wait", "idle, forgotten"])
def test_a_cut_whose_job_runs_another_world_fails_and_lets_go_of_the_gate(tmp_path, known):
    """A job of the cut that this shard runs with another number of ranks (known before,
    first seen during the wait, or kept as an idle job) fails the checkpoint at once, and
    the gate is let go, not held for the lease."""
    from ember.ps_server.shard import step_clocks

    server = ParameterServer(0, 1, checkpoint_root=str(tmp_path))
    server.create_table(SPEC)
    if known != "during the wait":
        _update_of_one_rank(server)
    if known == "idle, forgotten":
        for n in range(step_clocks.MAX_JOBS):  # newer jobs push it out of the live ones
            server.steps.clocks.job(StepClockView(f"other-{n}", 1, 0, 0, pb.EXACT, 30_000))
        assert JOB not in server.steps.clocks.applied_by_job()
    server.checkpoints.pause("c1", 30)
    started = time.monotonic()
    writer, failures = write_c1_in_thread(server, tmp_path)
    if known == "during the wait":
        assert server.gate.await_admitting(30)
        _update_of_one_rank(server)  # admitted, applied
    writer.join(60)
    assert time.monotonic() - started < 20  # not the lease's 30 s
    assert len(failures) == 1 and "it runs 1" in str(failures[0]), failures
    server.checkpoints.pause("c2", 300)  # c1 let go of the gate
    assert not (tmp_path / "c1").exists()


def test_cut_is_the_highest_clock_any_shard_applied():
    paused = [
        pb.PauseWritesResponse(jobs=[pb.JobClocks(job="a", applied=[3, 3])]),
        pb.PauseWritesResponse(
            jobs=[pb.JobClocks(job="a", applied=[4, 4]), pb.JobClocks(job="b", applied=[0])]
        ),
    ]
    assert dict(clock_cut(paused)) == {"a": [4, 4], "b": [0]}


class _AfterPause:
    """The coordinator's channels, starting ``late`` once every shard has paused (before the
    Checkpoint calls), so that update can only enter the checkpoint through the cut; each
    method's wait for a restarting shard is recorded."""

    def __init__(self, rpc, late) -> None:
        self.rpc, self.late, self.endpoints = rpc, late, rpc.endpoints
        self.threads: list[threading.Thread] = []
        self.patience: dict[str, float | None] = {}

    def run(self, calls, on_reply=None, restart_patience_s=None):
        if calls:
            self.patience[calls[0].method] = restart_patience_s
        if calls and calls[0].method == "Checkpoint":
            self.threads = in_threads(self.late)
        return self.rpc.run(calls, on_reply, restart_patience_s)


def test_checkpoint_of_two_shards_mid_clock_holds_one_clock_on_both(tmp_path):
    root = tmp_path / "ckpt"
    with (
        LocalCluster(2, extra_args=["--checkpoint-root", str(root)]) as cluster,
        PSClient(cluster.endpoints) as client,
    ):
        client.create_table(SPEC)
        owner = shard_of("emb", IDS, 2)
        rpc = client.shard_rpc

        def send(shard: int, clock: int, rank: int):
            request = update_request(clock, rank, IDS[owner == shard])
            return lambda: rpc.run([ShardCall(shard, "Update", request, 30.0)])

        for thread in in_threads(*(send(k, 0, r) for k in (0, 1) for r in (0, 1))):
            thread.join(60)  # clock 0 everywhere
        for thread in in_threads(send(0, 1, 0), send(0, 1, 1)):
            thread.join(60)  # clock 1 on shard 0 only
        late = in_threads(send(1, 1, 0))  # shard 1 has rank 0's clock 1, not rank 1's yet
        paused = _AfterPause(rpc, send(1, 1, 1))  # rank 1's arrives once every shard paused
        directory, _ = take_checkpoint(paused, root)
        for thread in late + paused.threads:
            thread.join(60)
        assert [applied_in_meta(directory, k, 2) for k in (0, 1)] == [[1, 1], [1, 1]]
        # From the pause on, a restarting shard fails the checkpoint at once.
        assert paused.patience == {
            "FlushReplicas": None, "PauseWrites": 0, "Checkpoint": 0, "CommitCheckpoint": 0
        }  # fmt: skip
        with (
            LocalCluster(2, extra_args=["--restore", str(directory)]) as restored_cluster,
            PSClient(restored_cluster.endpoints) as restored,
        ):
            rows = restored.pull("emb", torch.from_numpy(IDS))
        expected = client.pull("emb", torch.from_numpy(IDS))  # clocks 0 and 1 applied
        torch.testing.assert_close(rows, expected, rtol=0, atol=0)


def test_only_the_clocks_within_the_cut_pass_a_pause():
    admits = StepClocks().cut_admits({JOB: [2, 2]})
    assert admits((JOB, 0, 2)) and admits((JOB, 1, 0))
    assert not admits((JOB, 0, 3))  # the next clock waits for the checkpoint
    assert not admits(("other-job", 0, 0)) and not admits((JOB, 2, 0))  # no such rank


def test_a_job_the_shard_has_not_seen_is_not_at_the_cut():
    clocks = StepClocks()
    assert not clocks.cut_reached({JOB: [0, 0]})()  # its first clocks may be on the way
    assert clocks.cut_reached({JOB: [-1, -1]})()
