"""Bringing a starting shard to its durable state: restore a checkpoint, replay the write log.

Nothing is changed before everything it depends on has been checked: the
Redis database's topology, the write log's lock, topology and records, and
the checkpoint's checksums. Only then are this shard's rows in Redis deleted
and rebuilt.
"""

from __future__ import annotations

from pathlib import Path

from ember.ps_server.checkpoint_format import resolve_checkpoint
from ember.ps_server.config import ShardConfig
from ember.ps_server.errors import CheckpointStateError
from ember.ps_server.journal import replay
from ember.ps_server.server import ParameterServer
from ember.ps_server.stores import clear_shard
from ember.ps_server.write_log import WriteLog


def recover(server: ParameterServer, config: ShardConfig) -> None:
    """Restore ``config.restore`` and, with ``config.wal``, replay and attach the write log.

    With a write log the shard's state is its base checkpoint plus the log:
    rows of this shard an external store (Redis) still holds are deleted
    first and rebuilt, so a replayed push is never applied on top of itself.

    Raises:
        TopologyMismatchError: the Redis database or the log directory holds
            another shard count's state.
        WriteLogLockedError: another live process owns this shard's log.
        CheckpointStateError: ``--restore`` names another checkpoint than the
            one the log continues, or the log already holds requests that a
            restored checkpoint would precede.
        FileNotFoundError, DurableFileCorruptError: a checkpoint or log file
            is missing or damaged (nothing was changed).
    """
    marker = server.store_marker
    if marker is not None:
        marker.check_topology()
    if not config.wal:
        if config.restore:
            server.checkpoints.restore(server.checkpoints.load_chain(Path(config.restore)))
        if marker is not None:
            marker.start_serving()
        return
    write_log = WriteLog(
        Path(config.wal),
        config.shard,
        config.num_shards,
        config.wal_fsync,
        config.wal_fsync_interval_s,
        fault=server.fault,
    )
    write_log.claim()
    base, first_segment = write_log.base()
    requested = resolve_checkpoint(Path(config.restore)) if config.restore else None
    if requested is not None and base is not None and requested != base.resolve():
        raise CheckpointStateError(
            f"--restore {requested} is not the checkpoint the write log in {config.wal} "
            f"continues ({base}); restore without --wal, or start without --restore"
        )
    if requested is not None and base is None and write_log.segments():
        raise CheckpointStateError(
            f"the write log in {config.wal} holds requests from the very start; replaying them "
            f"onto checkpoint {requested} would apply them twice (move the log away first)"
        )
    checkpoint = requested or base
    chain = server.checkpoints.load_chain(checkpoint) if checkpoint is not None else None
    write_log.verify()
    clear_shard(config.store, config.shard)
    if chain is not None:
        server.checkpoints.restore(chain)
    replay(server, write_log)
    write_log.open()
    if requested is not None and base is None:  # the log now continues the restored checkpoint
        write_log.commit_base(requested, first_segment)
    server.journal.log = write_log
    if marker is not None:
        marker.start_serving()
