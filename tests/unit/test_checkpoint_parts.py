"""Checkpoint building blocks: the write gate's lease, change tracking, manifests and row files."""

import hashlib
import json
import logging
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from ember.ps_server.durability.checkpoint_coordinator import _resume_all
from ember.ps_server.durability.checkpoint_format import (
    MANIFEST,
    ROW_MAGIC,
    FileEntry,
    Manifest,
    checkpoint_chain,
    latest_checkpoint,
    next_checkpoint_id,
    read_row_file,
    shard_files_in,
    write_row_file,
)
from ember.ps_server.errors import (
    CheckpointStateError,
    DurableFileCorruptError,
    PSClientError,
    Status,
)
from ember.ps_server.shard.changed_ids import ChangedIds
from ember.ps_server.shard.write_gate import WriteGate
from ember.ps_server.stores import RowBatch
from ember.ps_server.wire.messages import pb
from ember.ps_server.wire.table_spec import TableSpec


def _writer(gate: WriteGate) -> tuple[threading.Thread, threading.Event]:
    """A thread entering ``gate`` as a writer, and the event it sets once inside."""
    entered = threading.Event()

    def writer() -> None:
        with gate.writing():
            entered.set()

    thread = threading.Thread(target=writer)
    thread.start()
    return thread, entered


def test_a_paused_gate_holds_writers_until_resumed():
    gate = WriteGate()
    gate.pause("c1", lease_s=60)
    thread, entered = _writer(gate)
    assert not entered.wait(0.2)  # held (a bounded look, not a synchronisation)
    with pytest.raises(CheckpointStateError, match="'c1' is in progress"):
        gate.pause("c2", lease_s=60)
    gate.resume("c1")
    thread.join(10)
    assert entered.is_set()


def test_an_expired_lease_resumes_writes_and_refuses_that_checkpoint():
    gate = WriteGate()
    gate.pause("c1", lease_s=0.05)
    with gate.writing():  # waits out the lease, then enters
        pass
    with pytest.raises(CheckpointStateError, match="lease ran out"):
        gate.claim("c1")
    with pytest.raises(CheckpointStateError, match="not paused"):
        gate.claim("never")


def test_a_claimed_gate_ignores_late_pauses_and_resumes_until_its_claim_ends():
    gate = WriteGate()
    gate.pause("c1", lease_s=60)
    gate.claim("c1")
    with pytest.raises(CheckpointStateError, match="writes its files here now"):
        gate.pause("c1", lease_s=0.05)  # a late PauseWrites would shorten the lease
    assert gate.resume("c1") is True  # a late ResumeWrites: ignored, and says so
    thread, entered = _writer(gate)
    assert gate.await_held(1, 10) and not entered.is_set()
    gate.end_claim("c1")
    thread.join(10)
    assert entered.is_set()


def test_a_failed_checkpoint_names_the_shards_that_still_write_its_files(caplog):
    calls = []

    def run(shard_calls, on_reply, restart_patience_s):  # shard 1 still writes; 2 is gone
        assert restart_patience_s == 0  # a restarting shard holds no pause to resume
        calls.extend(shard_calls)
        for k in range(2):
            on_reply(k, pb.ResumeWritesResponse(still_writing=k == 1))
        raise PSClientError("s2:1", Status.UNAVAILABLE, "gone")

    rpc = SimpleNamespace(endpoints=["s0:1", "s1:1", "s2:1"], run=run)
    with caplog.at_level(logging.WARNING):
        _resume_all(rpc, "ckpt-000004", "flush-9")
    assert [(c.shard, c.method, c.request.flush_id) for c in calls] == [
        (k, "ResumeWrites", "flush-9") for k in range(3)
    ]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "could not resume writes" in warnings[1]
    assert "shard s1:1 still writes the files of failed checkpoint ckpt-000004" in warnings[0]


def test_changed_ids_cover_everything_since_the_last_commit():
    changes = ChangedIds()
    changes.add(np.array([1, 2]))
    assert changes.cut().tolist() == []  # tracking starts at the first checkpoint
    changes.add(np.array([5, 3, 5]))
    assert changes.cut().tolist() == [3, 5]
    changes.add(np.array([7]))  # that checkpoint was never committed: carried over
    assert changes.cut().tolist() == [3, 5, 7]
    changes.commit()
    changes.add(np.array([9]))
    assert changes.cut().tolist() == [9]


def rows(count: int, dim: int = 3, width: int = 2) -> RowBatch:
    generator = torch.Generator().manual_seed(count)
    return RowBatch(
        torch.randn(count, dim, generator=generator),
        torch.rand(count, width, generator=generator),
        torch.arange(count, dtype=torch.int64),
    )


def test_row_files_round_trip_and_refuse_another_layout(tmp_path):
    chunks = [(np.arange(5, dtype=np.int64), rows(5)), (np.arange(10, 12, dtype=np.int64), rows(2))]
    entry = write_row_file(tmp_path / "t.rows", "t", 3, 2, chunks)
    assert entry.rows == 7 and entry.bytes == (tmp_path / "t.rows").stat().st_size
    back = list(read_row_file(tmp_path / "t.rows", 3, 2))
    for (ids, batch), (got_ids, got) in zip(chunks, back, strict=True):
        assert np.array_equal(ids, got_ids)
        assert torch.equal(batch.weights, got.weights) and torch.equal(batch.state, got.state)
        assert torch.equal(batch.versions, got.versions)
    with pytest.raises(DurableFileCorruptError, match="width 3 with state 2"):
        list(read_row_file(tmp_path / "t.rows", 4, 2))


def two_row_checkpoint(directory, num_shards: int = 1) -> tuple[TableSpec, FileEntry]:
    """A finished checkpoint in ``directory``: table "t", shard 0's file of two rows."""
    spec = TableSpec("t", dim=3)
    directory.mkdir()
    entry = write_row_file(directory / "t.rows", "t", 3, 0, [(np.arange(2), rows(2, width=0))])
    Manifest(directory.name, None, num_shards, [spec], {0: [entry]}).write(directory)
    return spec, entry


def test_unfinished_checkpoints_are_ignored_and_ids_keep_counting(tmp_path):
    first = tmp_path / "ckpt-000001"
    spec, entry = two_row_checkpoint(first)
    (tmp_path / "ckpt-000002").mkdir()  # a checkpoint that died before its manifest
    assert latest_checkpoint(tmp_path) == first
    assert next_checkpoint_id(tmp_path) == "ckpt-000003"
    ((directory, manifest),) = checkpoint_chain(tmp_path)
    assert directory == first and manifest.tables == [spec] and manifest.files[0] == [entry]


def test_a_missing_base_or_a_damaged_file_is_named(tmp_path):
    spec = TableSpec("t", dim=3)
    directory = tmp_path / "ckpt-000002"
    directory.mkdir()
    entry = write_row_file(directory / "t.rows", "t", 3, 0, [(np.arange(2), rows(2, width=0))])
    Manifest("ckpt-000002", "ckpt-000001", 1, [spec], {0: [entry]}).write(directory)
    with pytest.raises(FileNotFoundError, match="base checkpoint 'ckpt-000001' is missing"):
        checkpoint_chain(directory)
    Manifest("ckpt-000002", None, 1, [spec], {0: [entry]}).write(directory)
    (directory / "t.rows").write_bytes((directory / "t.rows").read_bytes()[:-1])
    with pytest.raises(DurableFileCorruptError, match=f"t.rows: .*expected sha256 {entry.sha256}"):
        checkpoint_chain(directory)
    bogus = FileEntry("gone.rows", "t", 1, 10, "0" * 64)
    Manifest("ckpt-000002", None, 1, [spec], {0: [bogus]}).write(directory)
    with pytest.raises(DurableFileCorruptError, match="gone.rows: missing"):
        checkpoint_chain(directory)
    (directory / MANIFEST).write_text("{not json")
    with pytest.raises(DurableFileCorruptError, match="not a readable manifest"):
        checkpoint_chain(directory)


def test_truncated_or_garbled_row_files_raise_the_corruption_error_at_every_cut(tmp_path):
    """A reader of a damaged file says which file is damaged, never struct.error or a
    JSON error: try every length the file can be cut to, and a garbled header."""
    path = tmp_path / "t.rows"
    chunks = [(np.arange(3, dtype=np.int64), rows(3)), (np.arange(7, 9, dtype=np.int64), rows(2))]
    write_row_file(path, "t", 3, 2, chunks)
    whole = path.read_bytes()
    chunk_ends = {len(whole)}
    for cut in range(len(whole)):
        path.write_bytes(whole[:cut])
        try:
            read = sum(len(ids) for ids, _ in read_row_file(path, 3, 2))
        except DurableFileCorruptError as error:
            assert str(path) in str(error)
            continue
        chunk_ends.add(cut)  # a cut at a chunk boundary reads as fewer rows (the sha256 catches it)
        assert read in (0, 3)
    assert len(chunk_ends) == 3
    header_end = (
        len(ROW_MAGIC) + 4 + int.from_bytes(whole[len(ROW_MAGIC) : len(ROW_MAGIC) + 4], "little")
    )
    path.write_bytes(
        whole[: len(ROW_MAGIC) + 4] + b"{" * (header_end - len(ROW_MAGIC) - 4) + whole[header_end:]
    )
    with pytest.raises(DurableFileCorruptError, match="unreadable header"):
        list(read_row_file(path, 3, 2))


def test_a_manifest_without_this_shards_files_or_fields_is_corruption(tmp_path):
    directory = tmp_path / "ckpt-000001"
    two_row_checkpoint(directory, num_shards=2)
    with pytest.raises(DurableFileCorruptError, match="lists no files of shard 1 of 2"):
        checkpoint_chain(directory, shard=1, num_shards=2)
    checkpoint_chain(directory, shard=0, num_shards=2)  # shard 0's own files are there
    body = json.loads((directory / MANIFEST).read_text())["body"]
    del body["files"]
    text = json.dumps(body, sort_keys=True)
    document = {"body": body, "sha256": hashlib.sha256(text.encode()).hexdigest()}
    (directory / MANIFEST).write_text(json.dumps(document))
    with pytest.raises(DurableFileCorruptError, match="manifest fields unreadable"):
        checkpoint_chain(directory)


def test_a_shards_files_in_a_checkpoint_are_its_own_whole_or_partly_written(tmp_path):
    names = [
        "shard-1-of-2.t.rows", "shard-1-of-2.meta.json", "shard-1-of-2.t.rows.tmp",
        "shard-1-of-20.t.rows", "shard-11-of-2.t.rows", "shard-1-of-4.t.rows",
        "shard-0-of-2.t.rows", MANIFEST,
    ]  # fmt: skip
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in shard_files_in(tmp_path, 1, 2)] == [
        "shard-1-of-2.meta.json", "shard-1-of-2.t.rows", "shard-1-of-2.t.rows.tmp",
    ]  # fmt: skip
    assert shard_files_in(tmp_path / "missing", 1, 2) == []
