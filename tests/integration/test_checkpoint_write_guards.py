"""A checkpoint is written once per shard: a second call of the same id while the first
writes, a retry or pause while its files are written, or any later write into a directory
that holds the shard's files is refused and changes nothing; through the coordinator, a
shard asked twice never yields a committed checkpoint."""

import shutil
import threading

import numpy as np
import pytest
import torch
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.client.shard_rpc import ShardCall
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.durability.checkpoint_coordinator import take_checkpoint
from ember.ps_server.durability.checkpoint_format import Manifest
from ember.ps_server.durability.recovery import recover
from ember.ps_server.errors import (
    CheckpointStateError,
    PSClientError,
    Status,
)
from ember.ps_server.shard.config import ShardConfig
from ember.ps_server.shard.initializers import initial_rows
from ember.ps_server.shard.server import ParameterServer
from ember.ps_server.shard.servicer import ParameterServerServicer
from ember.ps_server.wire.messages import encode_ids, pb
from ember.ps_server.wire.step_codec import (
    decode_update_request,
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


def test_a_second_call_writing_the_same_checkpoint_is_refused_and_changes_nothing(tmp_path):
    """A coordinator's retry of Checkpoint while its first call still waits for the cut is
    refused at once; the first call keeps the pause and writes the checkpoint."""
    server = ParameterServer(0, 1, checkpoint_root=str(tmp_path))
    server.create_table(SPEC)
    server.checkpoints.pause("c1", 10)  # a short lease: a retry that waits fails the test soon
    writer, failures = write_c1_in_thread(server, tmp_path)
    try:
        assert server.gate.await_admitting(30)
        with pytest.raises(CheckpointStateError, match="an earlier call is writing it"):
            server.checkpoints.write("c1", str(tmp_path / "c1"), "", cut={JOB: [0, 0]})
        with pytest.raises(CheckpointStateError, match="'c1' is in progress"):
            server.checkpoints.pause("c2", 300)  # the refused call did not let go of the gate
    finally:
        send = [lambda r=r: server.steps.update(decode_update_request(update_request(0, r)))
                for r in (0, 1)]  # fmt: skip
        for thread in in_threads(*send):
            thread.join(30)
    writer.join(60)
    assert failures == []
    assert applied_in_meta(tmp_path / "c1", 0, 1) == [0, 0]


def test_a_retry_or_resume_while_the_files_are_written_changes_nothing(tmp_path, monkeypatch):
    """While a checkpoint writes its files, a retried Checkpoint or PauseWrites is refused
    and a ResumeWrites ignored: no write enters the files, which hold the cut exactly."""
    from ember.ps_server.durability import shard_checkpoint

    writing, proceed = threading.Event(), threading.Event()
    write_files = shard_checkpoint.write_shard_files

    def blocked(*args, **kwargs):
        writing.set()
        assert proceed.wait(30)
        return write_files(*args, **kwargs)

    monkeypatch.setattr(shard_checkpoint, "write_shard_files", blocked)
    server = ParameterServer(0, 1, checkpoint_root=str(tmp_path))
    server.create_table(SPEC)

    def send(clock: int, rank: int):
        return lambda: server.steps.update(decode_update_request(update_request(clock, rank)))

    for thread in in_threads(send(0, 0), send(0, 1)):
        thread.join(30)
    server.checkpoints.pause("c1", 10)
    written = []
    (writer,) = in_threads(
        lambda: written.append(server.checkpoints.write("c1", str(tmp_path / "c1"), ""))
    )
    later: list[threading.Thread] = []
    try:
        assert writing.wait(30)
        with pytest.raises(CheckpointStateError, match="an earlier call is writing it"):
            server.checkpoints.write("c1", str(tmp_path / "c1"), "", cut={JOB: [0, 0]})
        with pytest.raises(CheckpointStateError, match="writes its files here now"):
            server.checkpoints.pause("c1", 10)
        resume = pb.ResumeWritesRequest(checkpoint_id="c1")  # ignored, and says so
        assert ParameterServerServicer(server).ResumeWrites(resume, None).still_writing
        later = in_threads(send(1, 0), send(1, 1))
        assert server.gate.await_held(1, 30)  # clock 1 waits for the files
    finally:
        proceed.set()
    writer.join(60)
    for thread in later:
        thread.join(30)
    (files, specs) = written[0]
    server.checkpoints.pause("c1", 10)  # a late PauseWrites, then a retry: refused
    with pytest.raises(CheckpointStateError, match="already holds this shard's files"):
        server.checkpoints.write("c1", str(tmp_path / "c1"), "")
    with pytest.raises(CheckpointStateError, match="already holds this shard's files"):
        server.checkpoints.write("c1", str(tmp_path / "c1"), "")  # a retry with no pause
    server.checkpoints.pause("c2", 10)  # the refused retries let go of the gate
    resume = pb.ResumeWritesRequest(checkpoint_id="c2")
    assert not ParameterServerServicer(server).ResumeWrites(resume, None).still_writing
    Manifest("c1", None, 1, specs, {0: files}).write(tmp_path / "c1")
    server.checkpoints.commit("c1")  # the refusals left the written checkpoint as it was
    assert applied_in_meta(tmp_path / "c1", 0, 1) == [0, 0]
    assert server.steps.clocks.snapshot()[JOB]["applied"] == [1, 1]  # clock 1 after the files
    restored = ParameterServer(0, 1)
    recover(restored, ShardConfig(restore=str(tmp_path / "c1")))
    after_clock_0 = initial_rows(SPEC, IDS).numpy() - grads(0, 0) - grads(0, 1)
    values = np.asarray(restored.pull("emb", encode_ids(IDS)).values).reshape(len(IDS), 4)
    np.testing.assert_allclose(values, after_clock_0)  # no row of clock 1 in the files


def test_no_checkpoint_writes_over_a_shards_files_but_a_deleted_one_may_be_redone(tmp_path):
    """A directory that holds any of this shard's files is refused, whatever the checkpoint
    id (a retry, or another checkpoint pointed at it); once they are deleted (an unfinished
    checkpoint cleaned up, or an automatic one after a failed manifest) it is written again
    under the same name."""
    server = ParameterServer(0, 1, checkpoint_root=str(tmp_path))
    server.create_table(SPEC)
    target = tmp_path / "ckpt-000001"
    server.checkpoints.pause("c1", 10)
    files, _ = server.checkpoints.write("c1", str(target), "")
    meta = next(target / f.path for f in files if f.path.endswith(".meta.json"))
    before = {f.path: (target / f.path).read_bytes() for f in files}
    meta.unlink()  # even one file of the shard left is enough to refuse
    for checkpoint in ("c1", "other"):
        server.checkpoints.pause(checkpoint, 10)
        with pytest.raises(CheckpointStateError, match="already holds this shard's files"):
            server.checkpoints.write(checkpoint, str(target), "")
    assert {p.name: p.read_bytes() for p in target.iterdir()} == {
        name: data for name, data in before.items() if name != meta.name
    }
    shutil.rmtree(target)
    server.checkpoints.pause("c1", 10)
    files, _ = server.checkpoints.write("c1", str(target), "")
    assert files and all((target / f.path).exists() for f in files)


class _CheckpointTwice:
    """The coordinator's channels, sending shard 0 its Checkpoint call twice at once, as
    a retry after a lost connection does while the first call still runs."""

    def __init__(self, rpc) -> None:
        self.rpc, self.endpoints = rpc, rpc.endpoints

    def run(self, calls, on_reply=None, restart_patience_s=None):
        if calls and calls[0].method == "Checkpoint":  # any refusal raises, as a retry's does
            replies = self.rpc.run(
                [*calls, ShardCall(0, "Checkpoint", calls[0].request)],
                restart_patience_s=restart_patience_s,
            )
            return replies[: len(calls)]
        return self.rpc.run(calls, on_reply, restart_patience_s)


def test_a_checkpoint_a_shard_was_asked_to_write_twice_is_never_committed(tmp_path):
    """Whichever of the two calls comes second is refused (while the first writes, or once
    its files are there): the coordinator writes no manifest, every shard writes again, and
    the next checkpoint is whole."""
    root = tmp_path / "ckpt"
    with (
        LocalCluster(2, extra_args=["--checkpoint-root", str(root)]) as cluster,
        PSClient(cluster.endpoints) as client,
    ):
        client.create_table(SPEC)
        ids = torch.from_numpy(IDS)
        client.push("emb", ids, torch.ones(len(IDS), 4))
        guards = r"an earlier call is writing it|already holds this shard's files"
        with pytest.raises(PSClientError, match=guards) as refused:
            take_checkpoint(_CheckpointTwice(client.shard_rpc), root, lease_s=300)
        assert refused.value.code == Status.FAILED_PRECONDITION
        assert cluster.endpoints[0] in str(refused.value)
        assert [p.name for p in root.iterdir()] == ["ckpt-000001"]
        assert not (root / "ckpt-000001" / "manifest.json").exists()
        pusher = threading.Thread(
            target=lambda: client.push("emb", ids, torch.ones(len(IDS), 4)), daemon=True
        )
        pusher.start()
        pusher.join(30)  # a shard still paused would hold it for the 300 s lease
        assert not pusher.is_alive()
        directory = client.checkpoint(root)
        assert directory.name == "ckpt-000002" and (directory / "manifest.json").exists()
        with (
            LocalCluster(2, extra_args=["--restore", str(directory)]) as restored_cluster,
            PSClient(restored_cluster.endpoints) as restored,
        ):
            rows = restored.pull("emb", ids)
        torch.testing.assert_close(rows, client.pull("emb", ids), rtol=0, atol=0)
