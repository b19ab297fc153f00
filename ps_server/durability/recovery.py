"""Bringing a starting shard to its durable state: restore a checkpoint, replay the write log.

Nothing is changed before everything it depends on has been checked: the
Redis database's topology, the write log's lock, topology and records, and
the checkpoint's checksums. Only then are this shard's rows in Redis deleted
and rebuilt.
"""

from __future__ import annotations

from pathlib import Path

from ember.ps_server.durability.auto_checkpoint import auto_directory
from ember.ps_server.durability.checkpoint_format import latest_checkpoint, resolve_checkpoint
from ember.ps_server.durability.journal import replay
from ember.ps_server.durability.recovery_progress import RecoveryProgress
from ember.ps_server.durability.write_log import WriteLog
from ember.ps_server.errors import CheckpointStateError, DurableStateError
from ember.ps_server.shard.config import ShardConfig
from ember.ps_server.shard.server import ParameterServer
from ember.ps_server.stores import clear_shard


def recover(
    server: ParameterServer, config: ShardConfig, progress: RecoveryProgress | None = None
) -> None:
    """Restore ``config.restore`` and, with ``config.wal``, replay and attach the write log;
    ``progress`` is told each stage as it begins.

    With a write log the shard's state is its base checkpoint plus the log:
    rows of this shard an external store (Redis) still holds are deleted
    first and rebuilt, so a replayed push is never applied on top of itself.

    Raises:
        TopologyMismatchError: the Redis database or the log directory holds
            another shard count's state.
        DurableStateError: the log is empty, but Redis holds this shard's rows or the
            shard's automatic checkpoints hold a finished one.
        WriteLogLockedError: another live process owns this shard's log.
        CheckpointStateError: ``--restore`` names another checkpoint than the
            one the log continues while the log holds requests after it, or the log
            already holds requests that a restored checkpoint would precede.
        FileNotFoundError, DurableFileCorruptError: a checkpoint or log file
            is missing or damaged (over Redis every file is checked before its rows are
            deleted; into memory a row file's sha256 is checked as it loads; the log may
            have begun an empty segment and, with ``--restore``, name the checkpoint as its
            base: a start with another ``--restore`` replaces it).
    """
    progress = progress or RecoveryProgress()
    marker = server.store_marker
    if marker is not None:
        progress.stage("checking its store")
        marker.check_topology()
    if not config.wal:
        chain = None
        if config.restore:
            progress.stage(f"loading checkpoint {config.restore}")
            chain = server.checkpoints.load_chain(Path(config.restore))
        if marker is not None:
            marker.start_serving()  # a new epoch first: an older process of this shard stops now
        if chain is not None:
            progress.stage(f"restoring checkpoint {config.restore}")
            server.checkpoints.restore(chain)
        return
    write_log = WriteLog(
        Path(config.wal),
        config.shard,
        config.num_shards,
        config.wal_fsync,
        config.wal_fsync_interval_s,
        fault=server.fault,
    )
    progress.stage("claiming its log")
    write_log.claim()
    try:
        _recover_with_log(server, config, write_log, progress)
    except BaseException:
        write_log.close()  # releases the log's lock
        raise
    server.journal.log = write_log


def _recover_with_log(
    server: ParameterServer, config: ShardConfig, write_log: WriteLog, progress: RecoveryProgress
) -> None:
    """Restore the log's base (or ``--restore``), replay the log and open it for appends."""
    marker = server.store_marker
    base, first_segment = write_log.base()
    started = bool(write_log.segments())  # a segment, even empty: the log began here
    progress.stage("verifying its log")
    records = write_log.verify()  # reads every record (cutting a torn tail), changes nothing else
    requested = resolve_checkpoint(Path(config.restore)) if config.restore else None
    if requested is not None and base is not None and requested != base.resolve() and records:
        raise CheckpointStateError(
            f"--restore {requested} is not the checkpoint the write log in {config.wal} "
            f"continues ({base}), and the log holds {records} request(s) after it; restore "
            "without --wal, or start without --restore"
        )
    if requested is not None and base is None and records:
        raise CheckpointStateError(
            f"the write log in {config.wal} holds requests from the very start; replaying them "
            f"onto checkpoint {requested} would apply them twice (move the log away first)"
        )
    if base is None and requested is None and not started and marker and marker.held():
        raise DurableStateError(
            f"redis at {marker.url} holds the rows of shard {config.shard} (marker "
            f"{marker.key.decode()}), but the write-ahead log in {config.wal} is empty: "
            "recovering from it would delete those rows and rebuild nothing. If that is the "
            "wrong or an unmounted directory, fix it. To start logging a store that has no log "
            "yet, take a checkpoint (ember checkpoint) and start with --restore CHECKPOINT "
            f"--wal {config.wal}"
        )
    own = _own_latest_checkpoint(config)
    if base is None and requested is None and not started and own is not None:
        raise DurableStateError(
            f"the write-ahead log in {config.wal} is empty, but this shard checkpointed "
            f"itself before ({own}): starting from nothing would serve fresh rows, and its "
            "automatic checkpoints would then prune the real ones. If that is the wrong or "
            f"an unmounted directory, fix it. To go on from that checkpoint, start with "
            f"--restore {own} --wal {config.wal}; to start afresh, move {own.parent} away"
        )
    checkpoint = requested or base
    chain = None
    if checkpoint is not None:
        progress.stage(f"loading checkpoint {checkpoint}")
        chain = server.checkpoints.load_chain(checkpoint)
    if requested is not None and (base is None or requested != base.resolve()):
        # The log (with no request after its base) continues the restored checkpoint from
        # now on: recorded before anything is deleted, so a start that dies midway restores
        # it again even without --restore, and --restore of another one replaces it.
        write_log.record_base(requested, first_segment)
    # The log's new segment exists before the marker: a start that dies from here on
    # leaves a log that has begun, so the next start rebuilds instead of refusing.
    write_log.open()
    if marker is not None:
        marker.start_serving(rebuilds=True)  # a new epoch first: an older process stops now
    progress.stage("clearing its rows in the store")
    clear_shard(config.store, config.shard, marker)
    if chain is not None:
        progress.stage(f"restoring checkpoint {checkpoint}")
        server.checkpoints.restore(chain)
    replay(server, write_log, progress, records)


def _own_latest_checkpoint(config: ShardConfig) -> Path | None:
    """The newest finished checkpoint among this shard's automatic ones, if any."""
    if not config.checkpoint_root:
        return None
    own = auto_directory(Path(config.checkpoint_root), config.shard, config.num_shards)
    return latest_checkpoint(own)
