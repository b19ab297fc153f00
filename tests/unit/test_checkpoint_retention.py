"""Automatic checkpoints' parts: which ones are kept, when one is incremental, the limits a
shard accepts, and that a single shard's checkpoint never restores onto another shard count."""

import errno
import shutil
from pathlib import Path

import numpy as np
import pytest
from ember.ps_server.durability import auto_checkpoint, shard_checkpoint
from ember.ps_server.durability.auto_checkpoint import (
    MAX_CHAIN,
    AutoCheckpoints,
    AutoPolicy,
    incremental_base,
)
from ember.ps_server.durability.checkpoint_format import MANIFEST, FileEntry, Manifest
from ember.ps_server.durability.log_records import FRAMING
from ember.ps_server.durability.retention import TRASH_PREFIX, prune_checkpoints
from ember.ps_server.durability.write_log import WriteLog
from ember.ps_server.errors import (
    CheckpointStateError,
    DurableFileCorruptError,
    PermissionDeniedError,
)
from ember.ps_server.shard.config import ShardConfig
from ember.ps_server.shard.server import ParameterServer
from ember.ps_server.wire.messages import pb
from ember.ps_server.wire.table_spec import TableSpec


def _checkpoint(root: Path, number: int, base: int | None, size: int = 100) -> Path:
    directory = root / f"ckpt-{number:06d}"
    directory.mkdir()
    files = {0: [FileEntry("shard-0-of-1.t.rows", "t", 1, size, "0" * 64)]}
    base_name = f"ckpt-{base:06d}" if base is not None else None
    Manifest(f"ckpt-{number:06d}", base_name, 1, [TableSpec("t", dim=4)], files).write(directory)
    return directory


def _names(root: Path) -> list[str]:
    return sorted(entry.name for entry in root.iterdir())


def test_the_newest_are_kept_with_the_chains_they_need(tmp_path):
    _checkpoint(tmp_path, 1, None)  # full
    _checkpoint(tmp_path, 2, 1)
    _checkpoint(tmp_path, 3, None)  # full
    _checkpoint(tmp_path, 4, 3)
    _checkpoint(tmp_path, 5, 4)
    deleted = prune_checkpoints(tmp_path, keep=2, protected=[])
    assert sorted(deleted) == ["ckpt-000001", "ckpt-000002"]
    assert _names(tmp_path) == ["ckpt-000003", "ckpt-000004", "ckpt-000005"]


def test_the_log_base_is_kept_however_old_and_leftovers_go(tmp_path):
    for number in (1, 2, 3):
        _checkpoint(tmp_path, number, None)
    (tmp_path / "ckpt-000004").mkdir()  # a failed attempt, older than the newest finished
    _checkpoint(tmp_path, 5, None)
    (tmp_path / "ckpt-000006").mkdir()  # one being written now
    (tmp_path / f"{TRASH_PREFIX}ckpt-000000").mkdir()  # an interrupted prune's
    deleted = prune_checkpoints(tmp_path, keep=1, protected=[tmp_path / "ckpt-000002"])
    assert sorted(deleted) == ["ckpt-000001", "ckpt-000003", "ckpt-000004"]
    assert _names(tmp_path) == ["ckpt-000002", "ckpt-000005", "ckpt-000006"]


def test_an_unreadable_manifest_stops_the_prune_before_anything_is_deleted(tmp_path):
    _checkpoint(tmp_path, 1, None)
    _checkpoint(tmp_path, 2, 1)
    _checkpoint(tmp_path, 3, 2)
    (tmp_path / "ckpt-000002" / MANIFEST).write_text("{")
    with pytest.raises(DurableFileCorruptError):
        prune_checkpoints(tmp_path, keep=1, protected=[])
    assert _names(tmp_path) == ["ckpt-000001", "ckpt-000002", "ckpt-000003"]
    with pytest.raises(ValueError, match="keep must be >= 1"):
        prune_checkpoints(tmp_path, keep=0)


def test_a_checkpoint_increments_until_the_chain_is_long_or_heavy(tmp_path):
    assert incremental_base(tmp_path, None) is None  # nothing to increment
    full = _checkpoint(tmp_path, 1, None, size=1000)
    assert incremental_base(tmp_path, full) == full
    assert incremental_base(tmp_path / "elsewhere", full) is None  # the cluster's base
    previous = full
    for number in range(2, MAX_CHAIN + 1):  # light increments up to the longest chain
        assert incremental_base(tmp_path, previous) == previous
        previous = _checkpoint(tmp_path, number, number - 1, size=10)
    assert incremental_base(tmp_path, previous) is None  # MAX_CHAIN checkpoints: full next
    heavy = _checkpoint(tmp_path, 20, 1, size=1001)  # outweighs its full checkpoint
    assert incremental_base(tmp_path, heavy) is None


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"wal_max_bytes": 0}, "wal_max_bytes must hold one record"),
        ({"wal_max_bytes": -1}, "wal_max_bytes must hold one record"),
        ({"wal_max_bytes": 65_536 + FRAMING - 1}, "65556 bytes"),  # one record does not fit
        ({"checkpoint_interval_s": 0.0}, "checkpoint_interval_s must be > 0"),
        ({"checkpoint_interval_s": -5.0}, "checkpoint_interval_s must be > 0"),
        ({"checkpoint_interval_s": float("inf")}, "checkpoint_interval_s must be > 0"),
        ({"checkpoint_keep": 0}, "checkpoint_keep must be >= 1"),
        ({"wal": "", "checkpoint_root": "/c"}, "give --wal and --checkpoint-root"),
        ({"wal": "/w", "checkpoint_root": ""}, "give --wal and --checkpoint-root"),
    ],
)
def test_bad_automatic_checkpoint_limits_are_refused(settings, message):
    config = ShardConfig(
        **{
            "wal": "/w",
            "checkpoint_root": "/c",
            "max_message_bytes": 65_536,
            "wal_max_bytes": 65_536 + FRAMING,
            **settings,
        }
    )
    with pytest.raises(ValueError, match=message):
        config.validate()


def test_the_smallest_limit_is_one_record_of_the_largest_request():
    ShardConfig(
        wal="/w", checkpoint_root="/c", max_message_bytes=65_536, wal_max_bytes=65_536 + FRAMING
    ).validate()


def test_one_shards_checkpoint_restores_onto_that_shard_only():
    files = {1: [FileEntry("shard-1-of-2.t.rows", "t", 1, 10, "0" * 64)]}
    manifest = Manifest("ckpt-000001", None, 2, [TableSpec("t", dim=4)], files)
    assert manifest.files_for(1, 2) == files[1]
    with pytest.raises(DurableFileCorruptError, match="no files of shard 0"):
        manifest.files_for(0, 2)
    with pytest.raises(CheckpointStateError, match=r"shard\(s\) \[1\] of 2 only"):
        manifest.files_for(0, 3)  # another count would lose shard 0's rows


SPEC = TableSpec("t", dim=4)


def _logged_server(tmp_path: Path) -> ParameterServer:
    server = ParameterServer(0, 1, checkpoint_root=str(tmp_path))
    write_log = WriteLog(tmp_path / "wal", 0, 1, "always")
    write_log.claim()
    write_log.open()
    server.journal.log = write_log
    server.create_table(SPEC)
    return server


def _push(server: ParameterServer, request: str) -> None:
    ids = np.arange(4, dtype=np.int64)
    server.push(SPEC.name, ids.tobytes(), np.ones((4, 4), np.float32).tobytes(), request)


def test_a_checkpoint_whose_commit_comes_after_another_write_is_refused(tmp_path, monkeypatch):
    server = _logged_server(tmp_path)
    checkpoints = server.checkpoints
    _push(server, "before")
    checkpoints.pause("C", 60)
    checkpoints.write("C", str(tmp_path / "c"), "")  # the coordinator waits for the others
    _push(server, "between")  # only in the segment C rotated to
    checkpoints.pause("A", 60)
    monkeypatch.setattr(shard_checkpoint, "write_shard_files", _full_disk)
    with pytest.raises(OSError, match="No space"):
        checkpoints.write("A", str(tmp_path / "a"), "")  # rotated, then failed
    with pytest.raises(CheckpointStateError, match="last wrote None"):
        checkpoints.commit("C")  # would drop the segment holding "between"
    records = [pb.LogRecord.FromString(r) for r in server.journal.log.replay()]
    assert "between" in [r.push.requests[0].request_id for r in records if r.HasField("push")]
    server.journal.close()


def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_an_idle_log_restarts_the_interval_instead_of_spinning(tmp_path):
    server = _logged_server(tmp_path)
    auto = AutoCheckpoints(
        server, server.journal.log, tmp_path / "auto", AutoPolicy(None, 0.5, 1), lambda _: None
    )
    auto._last -= 10  # the interval has long passed, with nothing logged since the base
    server.journal.log.record_base(tmp_path / "c", server.journal.log.rotate())
    assert server.journal.log.bytes_since_base == 0
    assert not auto._due()
    assert auto._until_interval() > 0.4  # a full interval's wait, not a busy loop
    _push(server, "one")
    auto._last -= 10
    assert auto._due()
    server.journal.close()


def test_a_damaged_metadata_file_is_refused_on_a_restore_into_memory(tmp_path):
    server = _logged_server(tmp_path)
    _push(server, "one")
    auto = AutoCheckpoints(
        server, server.journal.log, tmp_path / "auto", AutoPolicy(None, None, 1), lambda _: None
    )
    auto.directory.mkdir()
    checkpoint = auto.checkpoint()
    server.journal.close()
    (meta,) = checkpoint.glob("*.meta.json")
    meta.write_text(meta.read_text().replace('"one"', '"two"'))  # still valid JSON, same size
    fresh = ParameterServer(0, 1)
    with pytest.raises(DurableFileCorruptError, match="meta.json.*sha256"):
        fresh.checkpoints.restore(fresh.checkpoints.load_chain(checkpoint))


def test_a_failed_attempt_deletes_its_files_and_releases_the_pause(tmp_path, monkeypatch):
    server = _logged_server(tmp_path)
    auto = AutoCheckpoints(
        server, server.journal.log, tmp_path / "auto", AutoPolicy(None, None, 1), lambda _: None
    )
    auto.directory.mkdir()

    def half_written(tables, shard, num_shards, directory, *args):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "shard-0-of-1.t.rows").write_bytes(b"partial")
        _full_disk()

    monkeypatch.setattr(shard_checkpoint, "write_shard_files", half_written)
    with pytest.raises(OSError, match="No space"):
        auto.checkpoint()
    assert list(auto.directory.iterdir()) == []  # the next attempt finds the room again
    server.checkpoints.pause("next", 1)  # not held by the failed attempt
    server.checkpoints.resume("next")

    def outside_the_root(directory):
        raise PermissionDeniedError("resolves outside the root")

    monkeypatch.setattr(server.checkpoints, "checked_directory", outside_the_root)
    with pytest.raises(PermissionDeniedError):
        auto.checkpoint()  # refused before the write took the pause: released all the same
    server.checkpoints.pause("after", 1)
    server.journal.close()


def test_an_attempt_whose_manifest_failed_is_taken_again_under_the_same_name(tmp_path, monkeypatch):
    server = _logged_server(tmp_path)
    auto = AutoCheckpoints(
        server, server.journal.log, tmp_path / "auto", AutoPolicy(None, None, 1), lambda _: None
    )
    auto.directory.mkdir()
    write_manifest, failures = Manifest.write, [_full_disk]

    def once_full(manifest, directory):
        if failures:
            failures.pop()()
        write_manifest(manifest, directory)

    monkeypatch.setattr(Manifest, "write", once_full)
    with pytest.raises(OSError, match="No space"):
        auto.checkpoint()  # its rows and metadata were written, then deleted
    assert list(auto.directory.iterdir()) == []
    assert auto.checkpoint().name == "ckpt-000001"  # the same name, written again
    assert [p.name for p in auto.directory.iterdir()] == ["ckpt-000001"]
    server.journal.close()


def test_a_name_taken_meanwhile_fails_the_attempt_which_leaves_it_alone(tmp_path, monkeypatch):
    server = _logged_server(tmp_path)
    auto = AutoCheckpoints(
        server, server.journal.log, tmp_path / "auto", AutoPolicy(None, None, 1), lambda _: None
    )
    theirs = auto.directory / "ckpt-000001"
    theirs.mkdir(parents=True)
    (theirs / "shard-0-of-1.t.rows").write_bytes(b"another writer's")
    monkeypatch.setattr(auto_checkpoint, "next_checkpoint_id", lambda _: theirs.name)  # a race
    with pytest.raises(FileExistsError):
        auto.checkpoint()
    assert [p.name for p in auto.directory.iterdir()] == [theirs.name]  # nothing else made
    assert [p.name for p in theirs.iterdir()] == ["shard-0-of-1.t.rows"]
    assert (theirs / "shard-0-of-1.t.rows").read_bytes() == b"another writer's"
    server.checkpoints.pause("next", 1)  # the failed attempt let go of the pause
    server.checkpoints.resume("next")
    server.journal.close()


def test_a_removed_checkpoint_directory_is_made_again(tmp_path):
    server = _logged_server(tmp_path)
    auto = AutoCheckpoints(
        server, server.journal.log, tmp_path / "auto" / "shard-0-of-1", AutoPolicy(None, None, 1),
        lambda _: None,
    )  # fmt: skip
    auto.directory.mkdir(parents=True)
    shutil.rmtree(tmp_path / "auto")  # an operator's cleanup
    assert auto.checkpoint() == auto.directory / "ckpt-000001"
    assert (auto.directory / "ckpt-000001" / MANIFEST).exists()
    server.journal.close()


def test_the_log_only_continues_a_checkpoint_with_a_manifest(tmp_path):
    server = _logged_server(tmp_path)
    _push(server, "one")
    server.checkpoints.pause("C", 60)
    server.checkpoints.write("C", str(tmp_path / "c"), "")
    with pytest.raises(CheckpointStateError, match="has no manifest"):
        server.checkpoints.commit("C")  # the coordinator never wrote it: never the log's base
    assert server.journal.log.base() == (None, 1)
    server.journal.close()
