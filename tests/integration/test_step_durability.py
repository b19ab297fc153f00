"""Clocked updates survive a restart: the write-ahead log and checkpoints keep the clocks,
so an update retried after the restart is a duplicate, never applied twice."""

import shutil

import numpy as np
import pytest
import torch
from ember.ps_server.durability.checkpoint_format import Manifest
from ember.ps_server.durability.recovery import recover
from ember.ps_server.durability.write_log import WriteLog
from ember.ps_server.errors import CheckpointStateError, StoreCorruptError
from ember.ps_server.shard.config import ShardConfig
from ember.ps_server.shard.server import ParameterServer
from ember.ps_server.wire.messages import encode_ids, pb
from ember.ps_server.wire.row_dtype import RowDtype
from ember.ps_server.wire.row_packing import rows_to_wire
from ember.ps_server.wire.step_codec import (
    StepClockView,
    decode_update_request,
    encode_update_request,
)
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec

SPEC = TableSpec("emb", dim=4, optimizer=OptimizerSpec(OptimizerKind.ADAGRAD, lr=0.1))
IDS = np.arange(0, 60, 3, dtype=np.int64)


def started(tmp_path) -> ParameterServer:
    server = ParameterServer(0, 1, checkpoint_root=str(tmp_path))
    recover(server, ShardConfig(wal=str(tmp_path / "wal"), wal_fsync="always"))
    server.create_table(SPEC)
    return server


def update(server, step, world=2, rank=0):
    grads = np.random.default_rng(step * 7 + rank).standard_normal((len(IDS), 4)).astype("<f4")
    clock = StepClockView("job-x", world, rank, step, pb.EXACT, 20_000)
    request = encode_update_request([("emb", encode_ids(IDS), grads)], clock)
    return server.steps.update(decode_update_request(request))[0]


def rows(server):
    reply = server.pull("emb", encode_ids(IDS))
    return reply.values.copy(), reply.versions.copy()


def test_clocks_come_back_from_the_log_and_the_checkpoint(tmp_path):
    first = started(tmp_path)
    for step in range(2):
        update(first, step, world=1)
    first.checkpoints.pause("c1", 60)  # what a coordinator (PSClient.checkpoint) does
    files, specs = first.checkpoints.write("c1", str(tmp_path / "c1"), "")
    Manifest("c1", None, 1, specs, {0: files}).write(tmp_path / "c1")
    first.checkpoints.commit("c1")  # the log now continues this checkpoint
    update(first, 2, world=1)
    before = rows(first)
    first.journal.close()  # the process ends (its fsynced log stays)

    second = started(tmp_path)  # restores c1 (clocks 0, 1), replays clock 2
    after = rows(second)
    assert np.array_equal(after[0], before[0]) and after[1].tolist() == [3] * len(IDS)
    assert second.steps.clocks.snapshot()["job-x"]["applied"] == [2]
    assert update(second, 2, world=1) is True  # retried after the restart: a duplicate
    assert update(second, 1, world=1) is True
    assert update(second, 3, world=1) is False
    assert rows(second)[1].tolist() == [4] * len(IDS)
    second.journal.close()


def test_packed_gradients_are_logged_as_the_float32_they_were_applied_as(tmp_path):
    first = started(tmp_path)
    grads = torch.randn(len(IDS), 4, generator=torch.Generator().manual_seed(5))
    packed = rows_to_wire(grads, RowDtype.BFLOAT16, "grads", IDS)
    for step in range(3):
        clock = StepClockView("job-b", 1, 0, step, pb.EXACT, 20_000)
        entry = ("emb", encode_ids(IDS), packed, RowDtype.BFLOAT16)
        first.steps.update(decode_update_request(encode_update_request([entry], clock)))
    before = rows(first)
    first.journal.close()

    second = started(tmp_path)  # replays the three clocks from the log alone
    after = rows(second)
    assert np.array_equal(after[0], before[0]) and after[1].tolist() == [3] * len(IDS)
    second.journal.close()
    logged = [
        t
        for payload in WriteLog(tmp_path / "wal", 0, 1).replay()
        if (record := pb.LogRecord.FromString(payload)).WhichOneof("entry") == "step"
        for t in record.step.tables
    ]
    assert len(logged) == 3 and all(t.dtype == RowDtype.FLOAT32 for t in logged)
    assert all(len(t.grads) == len(IDS) * 4 * 4 for t in logged)  # widened, 4 bytes each


def test_a_logged_clock_whose_gradients_are_not_float32_is_refused_as_corrupt(tmp_path):
    server = started(tmp_path)
    record = pb.StepApplied(
        clock=pb.StepClock(job="job-c", world=1, rank=0, clock=0, mode=pb.EXACT, wait_ms=1),
        tables=[pb.TableGrads(table="emb", ids=encode_ids(IDS), grads=bytes(len(IDS) * 8),
                              dtype=RowDtype.FLOAT16)],
    )  # fmt: skip
    with pytest.raises(StoreCorruptError, match="a shard logs float32 only"):
        server.steps.replay(record)
    assert rows(server)[1].tolist() == [0] * len(IDS)
    server.journal.close()


def _checkpointed(tmp_path):
    """A checkpoint ``c1`` of a shard that applied clock 0, and that shard's rows."""
    first = started(tmp_path)
    update(first, 0, world=1)
    first.checkpoints.pause("c1", 60)
    files, specs = first.checkpoints.write("c1", str(tmp_path / "c1"), "")
    Manifest("c1", None, 1, specs, {0: files}).write(tmp_path / "c1")
    first.checkpoints.commit("c1")
    saved = rows(first)
    first.journal.close()
    return saved


def _dies_restoring(tmp_path, monkeypatch, checkpoint, wal):
    """A first start with ``--restore checkpoint --wal wal`` killed while it restores."""

    def killed(chain):
        raise OSError("killed mid-restore")

    dying = ParameterServer(0, 1, checkpoint_root=str(tmp_path))
    monkeypatch.setattr(dying.checkpoints, "restore", killed)
    with pytest.raises(OSError, match="killed mid-restore"):
        recover(dying, ShardConfig(restore=str(checkpoint), wal=wal))


def test_a_first_restore_into_a_log_that_dies_midway_is_restored_by_a_plain_restart(
    tmp_path, monkeypatch
):
    """The first start with --restore C --wal W dies after its log began and before C was
    restored. The next start, without --restore (a log that has begun refuses one, and says
    to start without it), must restore C again, not serve empty tables."""
    saved = _checkpointed(tmp_path)
    wal = str(tmp_path / "new-wal")
    _dies_restoring(tmp_path, monkeypatch, tmp_path / "c1", wal)
    plain = ParameterServer(0, 1, checkpoint_root=str(tmp_path))
    recover(plain, ShardConfig(wal=wal))
    after = rows(plain)
    assert np.array_equal(after[0], saved[0]) and np.array_equal(after[1], saved[1])
    plain.journal.close()


def test_a_log_with_no_request_after_its_base_may_restore_another_checkpoint(tmp_path, monkeypatch):
    """A start that failed restoring a (damaged) checkpoint left it as the new log's base;
    with no request logged after it, --restore of another checkpoint replaces it."""
    saved = _checkpointed(tmp_path)
    shutil.copytree(tmp_path / "c1", tmp_path / "damaged")
    wal = str(tmp_path / "new-wal")
    _dies_restoring(tmp_path, monkeypatch, tmp_path / "damaged", wal)
    other = ParameterServer(0, 1, checkpoint_root=str(tmp_path))
    recover(other, ShardConfig(restore=str(tmp_path / "c1"), wal=wal))
    after = rows(other)
    assert np.array_equal(after[0], saved[0]) and np.array_equal(after[1], saved[1])
    update(other, 1, world=1)  # now the log holds a request after its base, c1
    other.journal.close()
    with pytest.raises(CheckpointStateError, match=r"holds 1 request\(s\) after it"):
        recover(
            ParameterServer(0, 1, checkpoint_root=str(tmp_path)),
            ShardConfig(restore=str(tmp_path / "damaged"), wal=wal),
        )


def test_a_log_holding_a_request_id_longer_than_new_requests_may_send_still_replays(tmp_path):
    """The request-id limit is checked where requests arrive: a log written before it, with
    a longer id, must still replay."""
    first = started(tmp_path)
    grads = np.full((len(IDS), 4), 0.5, dtype="<f4").tobytes()
    first.push("emb", encode_ids(IDS), grads, "r" * 300)
    before = rows(first)
    first.journal.close()
    second = started(tmp_path)
    after = rows(second)
    assert np.array_equal(after[0], before[0]) and np.array_equal(after[1], before[1])
    assert second.push("emb", encode_ids(IDS), grads, "r" * 300) == (True, 0)  # remembered
    second.journal.close()
