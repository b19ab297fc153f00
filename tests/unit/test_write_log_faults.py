"""The write-ahead log under faults: a full disk, failing fsyncs and rotations, and faults
elsewhere in the shard. Durability fails closed: no record is acknowledged before an fsync
covers it."""

import errno
import os
import threading

import numpy as np
import pytest
from ember.ps_server.durability import durable_files, write_log
from ember.ps_server.durability.write_log import WriteLog
from ember.ps_server.errors import DurableStateError, ShardFailedError

from tests.support.write_logs import open_log


def _failing(error_number: int, keep_bytes: int = 0):
    """A stand-in for an os call that fails; as writev, it first writes ``keep_bytes``."""

    def fail(fd, *rest):
        if keep_bytes:
            os.write(fd, b"".join(bytes(part) for part in rest[0])[:keep_bytes])
        raise OSError(error_number, os.strerror(error_number))

    return fail


@pytest.mark.parametrize("cut_back", [True, False], ids=["cut-back", "cut-back-fails"])
def test_a_disk_that_fills_mid_record_fails_closed_and_recovers_to_the_last_whole_record(
    tmp_path, monkeypatch, cut_back
):
    log = open_log(tmp_path)
    log.fault.supervise()  # a restart does not repair a disk: even a supervised shard stays up
    for payload in (b"one", b"two"):
        log.sync(log.append(payload))
    monkeypatch.setattr(write_log.os, "writev", _failing(errno.ENOSPC, keep_bytes=7))
    if not cut_back:
        monkeypatch.setattr(write_log.os, "ftruncate", _failing(errno.EIO))
    with pytest.raises(ShardFailedError, match="No space left.*restart the shard"):
        log.append(b"three-never-acknowledged")
    assert log.fault.reason is not None and not log.fault.restarting
    monkeypatch.undo()  # the disk has room again, but the log stays failed
    with pytest.raises(ShardFailedError):
        log.append(b"four")
    with pytest.raises(ShardFailedError):
        log.sync(10**9)
    log.close()
    assert list(WriteLog(tmp_path, 1, 3).replay()) == [b"one", b"two"]


def _assert_acknowledges_nothing_more(log: WriteLog, ticket: int) -> None:
    """A failed log neither syncs ``ticket`` nor takes another record; then close it."""
    with pytest.raises(ShardFailedError):
        log.sync(ticket)
    with pytest.raises(ShardFailedError):
        log.append(b"after")
    log.close()


@pytest.mark.parametrize("rotated", [False, True], ids=["one-segment", "after-a-rotation"])
@pytest.mark.parametrize("failing", ["sync", "rotate", "close"])
def test_a_failed_fsync_is_never_followed_by_an_acknowledgement(
    tmp_path, monkeypatch, rotated, failing
):
    """Nor does a restart replay what no fsync covered: after a failed fsync (of a request's
    sync, a checkpoint's rotation or the close) the kernel may never write those pages, yet
    it would serve them from its cache. They are cut off, to the byte."""
    log = open_log(tmp_path, fsync="always")
    log.sync(log.append(b"durable"))
    if rotated:
        log.rotate()
        log.sync(log.append(b"durable-too"))
    segment = log.files.path(log.segments()[-1])
    durable_bytes = segment.stat().st_size
    ticket = log.append(b"not-durable")
    log.append(b"appended-after")
    monkeypatch.setattr(write_log.os, "fsync", _failing(errno.EIO))
    if failing == "close":
        log.close()
        assert "Input/output error" in log.fault.reason
    else:
        with pytest.raises(ShardFailedError, match="fsync.*failed.*Input/output error.*cut off"):
            log.sync(ticket) if failing == "sync" else log.rotate()
        monkeypatch.undo()  # a later fsync would succeed: it must not be tried
        _assert_acknowledges_nothing_more(log, ticket)
    monkeypatch.undo()
    assert segment.stat().st_size == durable_bytes
    durable = [b"durable", b"durable-too"] if rotated else [b"durable"]
    assert list(WriteLog(tmp_path, 1, 3).replay()) == durable


def test_a_failed_fsync_in_the_interval_thread_stops_acknowledgements(tmp_path, monkeypatch):
    log = WriteLog(tmp_path, 1, 3, fsync="interval", interval_s=0.01)
    tripped = threading.Event()
    log.fault.on_trip(lambda reason: tripped.set())
    log.open()
    monkeypatch.setattr(write_log.os, "fsync", _failing(errno.EIO))
    ticket = log.append(b"record")
    assert tripped.wait(30), "the fsync thread died without tripping the fault"
    assert "fsync" in log.fault.reason and "Input/output error" in log.fault.reason
    _assert_acknowledges_nothing_more(log, ticket)
    monkeypatch.undo()
    assert list(WriteLog(tmp_path, 1, 3).replay()) == []  # no fsync covered it


def test_always_mode_acknowledges_a_push_only_after_an_fsync_that_covers_its_record(
    tmp_path, monkeypatch
):
    """Crash tests cannot see a missing fsync (the page cache outlives the process): record
    every fsync with the log size it made durable, and the acknowledgement."""
    from ember.ps_server.shard.server import ParameterServer
    from ember.ps_server.wire.messages import encode_ids
    from ember.ps_server.wire.table_spec import TableSpec

    server = ParameterServer(0, 1)
    server.create_table(TableSpec("t", dim=4))
    log = WriteLog(tmp_path, 0, 1, fsync="always")
    log.open()
    server.journal.log = log
    events = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        real_fsync(fd)
        events.append(("fsync", os.fstat(fd).st_size))

    monkeypatch.setattr(write_log.os, "fsync", recording_fsync)
    for n in range(3):
        server.push(
            "t", encode_ids(np.array([n, n + 10])), np.ones((2, 4), np.float32).tobytes(), f"r{n}"
        )
        (segment,) = tmp_path.glob("*.wal")
        events.append(("ack", segment.stat().st_size))
    log.close()
    for position, (kind, record_end) in enumerate(events):
        if kind == "ack":
            synced = [size for k, size in events[:position] if k == "fsync"]
            assert synced and max(synced) >= record_end, events


@pytest.mark.parametrize("failing", ["open", "directory fsync"])
def test_a_rotation_that_cannot_create_the_next_segment_fails_alone(tmp_path, monkeypatch, failing):
    """Out of file descriptors, or the new segment's entry cannot be made durable: the
    checkpoint that rotates fails, the log goes on in its current segment (never through a
    closed descriptor), and no half-made segment blocks the next rotation."""
    log = open_log(tmp_path)
    log.sync(log.append(b"before"))
    if failing == "open":
        real_open = os.open

        def no_more_files(path, flags, *rest, **kwargs):
            if str(path).endswith(".wal"):
                raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
            return real_open(path, flags, *rest, **kwargs)

        monkeypatch.setattr(write_log.os, "open", no_more_files)
        match = "Too many open files"
    else:
        monkeypatch.setattr(write_log, "fsync_directory", _failing(errno.EIO))
        match = "Input/output error"
    with pytest.raises(OSError, match=match):
        log.rotate()
    monkeypatch.undo()
    assert log.fault.reason is None
    log.sync(log.append(b"after"))
    assert log.rotate() == 2
    log.sync(log.append(b"rotated"))
    log.close()
    assert list(WriteLog(tmp_path, 1, 3).replay()) == [b"before", b"after", b"rotated"]
    assert WriteLog(tmp_path, 1, 3).segments() == [1, 2]


def test_replay_fsyncs_the_directory_and_each_segment_before_yielding_its_records(
    tmp_path, monkeypatch
):
    """A record whose writer died before fsyncing it is still in the page cache: a restart
    replays it and acknowledges retries of it as duplicates, so it must be durable first.
    A crash test cannot see this (the page cache outlives the process): record the fsyncs."""
    log = open_log(tmp_path, fsync="interval")
    log.append(b"segment 1")
    log.rotate()
    log.append(b"segment 2")
    log.close()
    files = {os.stat(tmp_path / f"shard-1-of-3.{n:08d}.wal").st_ino: f"segment {n}" for n in (1, 2)}
    files[os.stat(tmp_path).st_ino] = "directory"
    synced = []
    real_fsync = os.fsync

    def recording(fd):
        real_fsync(fd)
        synced.append(files.get(os.fstat(fd).st_ino))

    monkeypatch.setattr(durable_files.os, "fsync", recording)
    replayed = []
    for payload in WriteLog(tmp_path, 1, 3).replay():
        assert synced[0] == "directory" and payload.decode() in synced, (payload, synced)
        replayed.append(payload)
    assert replayed == [b"segment 1", b"segment 2"]


def test_a_log_that_cannot_be_fsynced_at_replay_is_not_replayed(tmp_path, monkeypatch):
    log = open_log(tmp_path, fsync="interval")
    log.append(b"never fsynced")
    log.close()
    monkeypatch.setattr(durable_files.os, "fsync", _failing(errno.EIO))
    with pytest.raises(
        DurableStateError, match="cannot make the write-ahead log durable.*Input/output"
    ):
        next(iter(WriteLog(tmp_path, 1, 3).replay()))


def test_a_fault_elsewhere_in_the_shard_still_lets_acknowledged_records_become_durable(
    tmp_path, monkeypatch
):
    log = open_log(tmp_path, fsync="interval")
    log.append(b"acknowledged under interval")
    log.fault.trip("redis lost this shard's marker")
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(write_log.os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    log.close()
    assert synced  # the final fsync ran
    with pytest.raises(ShardFailedError):
        log.append(b"refused after the fault")
    assert list(WriteLog(tmp_path, 1, 3).replay()) == [b"acknowledged under interval"]


def test_the_interval_thread_keeps_syncing_after_a_fault_elsewhere_in_the_shard(
    tmp_path, monkeypatch
):
    log = WriteLog(tmp_path, 1, 3, fsync="interval", interval_s=0.01)
    synced = threading.Event()
    real_fsync = os.fsync

    def recording(fd):
        real_fsync(fd)
        synced.set()

    log.open()
    log.append(b"acknowledged under interval")
    log.fault.trip("redis lost this shard's marker")
    monkeypatch.setattr(write_log.os, "fsync", recording)
    assert synced.wait(30), "the fsync thread stopped with the shard's fault"
    log.close()


def test_a_retried_step_update_is_not_acknowledged_once_its_records_fsync_failed(
    tmp_path, monkeypatch
):
    """A client retries an update whose first attempt is stuck in its record's fsync: the
    retry finds the clock applied, and must not answer 'duplicate' (an acknowledgement)
    when that fsync then fails. Ordered by events: the retry passes the shard's fault check
    while the fsync hangs, then the fsync fails."""
    from ember.ps_server.shard.server import ParameterServer
    from ember.ps_server.wire.messages import pb

    from tests.support.steps_in_process import ADAM, update

    server = ParameterServer(0, 1)
    server.create_table(ADAM)
    server.journal.log = WriteLog(tmp_path, 0, 1, fsync="always", fault=server.fault)
    server.journal.log.open()
    in_fsync, fail_now, retry_checked = threading.Event(), threading.Event(), threading.Event()

    def hanging_then_failing(fd):
        in_fsync.set()
        assert fail_now.wait(30)
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    real_check = server.fault.check

    def check():
        real_check()
        if threading.current_thread().name == "retry":
            retry_checked.set()

    monkeypatch.setattr(write_log.os, "fsync", hanging_then_failing)
    monkeypatch.setattr(server.fault, "check", check)
    outcomes = {}

    def attempt():
        try:
            outcomes[threading.current_thread().name] = update(
                server, 0, [1, 2], np.ones((2, 3)), world=1, mode=pb.ASYNC
            )
        except ShardFailedError as error:
            outcomes[threading.current_thread().name] = error

    first = threading.Thread(target=attempt, name="first")
    first.start()
    assert in_fsync.wait(30)
    retry = threading.Thread(target=attempt, name="retry")
    retry.start()
    assert retry_checked.wait(30)
    fail_now.set()
    first.join(30)
    retry.join(30)
    assert isinstance(outcomes["first"], ShardFailedError), outcomes
    assert isinstance(outcomes["retry"], ShardFailedError), outcomes
