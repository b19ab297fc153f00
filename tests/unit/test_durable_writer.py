"""The durable writer streams large files out as it goes, and a failed write leaves no file;
a row file is checked as the very file it is read from."""

import ctypes
import errno
import hashlib

import numpy as np
import pytest
import torch
from ember.ps_server.durability import durable_files
from ember.ps_server.durability.checkpoint_format import read_row_file, write_row_file
from ember.ps_server.durability.durable_files import DurableWriter
from ember.ps_server.errors import DurableFileCorruptError
from ember.ps_server.stores import RowBatch


def test_blocks_go_to_the_disk_while_writing_and_the_file_is_exact(tmp_path, monkeypatch):
    monkeypatch.setattr(durable_files, "FLUSH_BYTES", 1000)
    events = []
    real_stream_out, real_fsync = durable_files._stream_out, durable_files.os.fsync
    monkeypatch.setattr(
        durable_files,
        "_stream_out",
        lambda fd, previous, block: (
            events.append(("block", block)) or real_stream_out(fd, previous, block)
        ),
    )
    monkeypatch.setattr(
        durable_files.os, "fsync", lambda fd: events.append(("fsync",)) or real_fsync(fd)
    )
    parts = [bytes([k]) * 700 for k in range(10)]
    path = tmp_path / "rows"
    with DurableWriter(path) as writer:
        for part in parts:
            writer.write(part)
        writer.commit()
    data = b"".join(parts)
    assert path.read_bytes() == data and writer.sha256 == hashlib.sha256(data).hexdigest()
    blocks = [event[1] for event in events if event[0] == "block"]
    assert blocks == [(0, 1400), (1400, 2800), (2800, 4200), (4200, 5600), (5600, 7000)]
    assert events.index(("fsync",)) > events.index(("block", (5600, 7000)))  # then the fsync


@pytest.mark.parametrize("planted", ["symlink", "hard link", "stale file"])
def test_a_durable_file_never_writes_through_what_its_temp_name_holds(tmp_path, planted):
    """Whoever can write the directory cannot redirect the write to another file by
    planting a link at the temp name; a temp file left by a crash is replaced."""
    victim = tmp_path / "elsewhere" / "victim"
    victim.parent.mkdir()
    victim.write_bytes(b"keep me")
    directory = tmp_path / "ckpt"
    directory.mkdir()
    target = directory / "shard-0-of-1.meta.json"
    temp = directory / "shard-0-of-1.meta.json.tmp"
    if planted == "symlink":
        temp.symlink_to(victim)
    elif planted == "hard link":
        temp.hardlink_to(victim)
    else:
        temp.write_bytes(b"half of an old write")
    digest = durable_files.write_durably(target, b"the real metadata")
    assert victim.read_bytes() == b"keep me"
    assert target.read_bytes() == b"the real metadata" and not target.is_symlink()
    assert digest == hashlib.sha256(b"the real metadata").hexdigest()
    assert not temp.exists()


def test_a_failed_write_is_raised_and_leaves_no_file(tmp_path, monkeypatch):
    path = tmp_path / "rows"
    writer = DurableWriter(path)

    def full(data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writer._file, "write", full)
    with pytest.raises(OSError, match="No space left"), writer:
        writer.write(b"x" * 100)
        writer.commit()
    assert not path.exists() and not path.with_name("rows.tmp").exists()


def test_a_filesystem_without_sync_file_range_falls_back_to_fdatasync(tmp_path, monkeypatch):
    monkeypatch.setattr(durable_files, "FLUSH_BYTES", 1000)
    calls = []

    def unsupported(fd, start, length, flags):
        calls.append("sync_file_range")
        ctypes.set_errno(errno.ENOSYS)
        return -1

    real_fdatasync = durable_files.os.fdatasync
    monkeypatch.setattr(durable_files, "_SYNC_RANGE", unsupported)
    monkeypatch.setattr(
        durable_files.os, "fdatasync", lambda fd: calls.append("fdatasync") or real_fdatasync(fd)
    )
    path = tmp_path / "rows"
    with DurableWriter(path) as writer:
        for k in range(4):
            writer.write(bytes([k]) * 700)
        writer.commit()
    assert path.read_bytes() == b"".join(bytes([k]) * 700 for k in range(4))
    assert calls == ["sync_file_range", "fdatasync", "fdatasync"]  # asked once, then not again
    assert durable_files._SYNC_RANGE is None


def _row_file(path, rows: int) -> str:
    ids = np.arange(rows, dtype=np.int64)
    batch = RowBatch(
        torch.ones(rows, 4), torch.zeros(rows, 0), torch.zeros(rows, dtype=torch.int64)
    )
    chunks = [
        (ids[k : k + 10], batch.select(np.isin(ids, ids[k : k + 10]))) for k in range(0, rows, 10)
    ]
    return write_row_file(path, "t", 4, 0, chunks).sha256


def test_a_row_file_is_checked_as_the_same_open_file_it_is_read_from(tmp_path):
    path = tmp_path / "t.rows"
    good = _row_file(path, 50)
    reader = read_row_file(path, 4, 0, good)
    first = next(reader)
    _row_file(tmp_path / "other.rows", 60)
    (tmp_path / "other.rows").replace(path)  # swapped under the reader: not what it checks
    assert sum(len(ids) for ids, _ in reader) + len(first[0]) == 50
    with pytest.raises(DurableFileCorruptError, match="does not match"):
        list(read_row_file(path, 4, 0, good))  # the new file is not the one listed
    early = read_row_file(path, 4, 0, good)
    next(early)
    early.close()  # stops the check without judging: the caller took only part


def test_directories_made_for_durable_files_are_durable_in_their_parents(tmp_path, monkeypatch):
    """A file fsynced into a directory whose own entry a crash forgets is lost with it: every
    directory created is fsynced into its parent, in order, and nothing more is created."""
    (tmp_path / "kept").mkdir()
    synced = []
    real = durable_files.fsync_directory
    monkeypatch.setattr(
        durable_files, "fsync_directory", lambda path: synced.append(path) or real(path)
    )
    durable_files.make_directory_durably(tmp_path / "kept" / "a" / "b")
    assert synced == [tmp_path / "kept", tmp_path / "kept" / "a"]
    assert (tmp_path / "kept" / "a" / "b").is_dir()
    synced.clear()
    durable_files.make_directory_durably(tmp_path / "kept" / "a" / "b")  # there already
    assert synced == []
