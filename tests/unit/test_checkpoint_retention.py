"""Automatic checkpoints' parts: which ones are kept, when one is incremental, the limits a
shard accepts, and that a single shard's checkpoint never restores onto another shard count."""

from pathlib import Path

import pytest
from ember.ps_server.durability.auto_checkpoint import MAX_CHAIN, incremental_base
from ember.ps_server.durability.checkpoint_format import MANIFEST, FileEntry, Manifest
from ember.ps_server.durability.log_records import FRAMING
from ember.ps_server.durability.retention import TRASH_PREFIX, prune_checkpoints
from ember.ps_server.errors import CheckpointStateError, DurableFileCorruptError
from ember.ps_server.shard.config import ShardConfig
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
