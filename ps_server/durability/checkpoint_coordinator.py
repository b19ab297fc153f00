"""Taking a checkpoint of a whole cluster: have trainers write their hot-row replicas back,
pause every shard, agree a clock cut, write, manifest last, commit."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from ember.ps_server.client.shard_rpc import ShardCall, ShardRPC
from ember.ps_server.durability.checkpoint_format import (
    FileEntry,
    Manifest,
    latest_checkpoint,
    next_checkpoint_id,
)
from ember.ps_server.durability.durable_files import fsync_directory, make_directory_durably
from ember.ps_server.durability.replica_checkpoint import (
    flush_replicas,
    flush_wait_ms,
    new_flush_id,
    release_jobs,
)
from ember.ps_server.errors import PSClientError, Status
from ember.ps_server.wire.messages import pb
from ember.ps_server.wire.table_spec import TableSpec

log = logging.getLogger(__name__)

DEFAULT_LEASE_S = 60.0
DEFAULT_FLUSH_WAIT_S = 60.0


def take_checkpoint(
    rpc: ShardRPC,
    root: Path,
    incremental: bool = False,
    lease_s: float = DEFAULT_LEASE_S,
    flush_wait_s: float = DEFAULT_FLUSH_WAIT_S,
    release: Sequence[str] = (),
) -> tuple[Path, Manifest]:
    """Checkpoint every shard reachable through ``rpc`` into a new directory under ``root``.

    First every training job that holds hot-row replicas writes them back and
    waits (see the FlushReplicas comment in the .proto). Then every shard
    pauses writes, so all files hold one moment of the cluster; each shard
    resumes as soon as its files are written. The manifest is written only
    when every shard succeeded.

    Args:
        rpc: channels to all shards, in shard order; its timeout must cover
            the slowest shard's write.
        root: checkpoint root, shared by all shards (same path on each).
        incremental: write only rows changed since the newest checkpoint under ``root``.
        lease_s: how long a shard holds writes waiting for the write call.
        flush_wait_s: how long to wait for the replica jobs' write-backs.
        release: replica jobs whose trainers died, no longer waited for from now on
            (their hot rows are in the checkpoint as last written back).

    Returns:
        The new checkpoint's directory and manifest.

    Raises:
        ValueError: ``incremental`` without an earlier checkpoint under ``root``, or a
            bad ``flush_wait_s``.
        PSClientError: a shard refused or failed, a replica job did not write back in
            time or went on before the pause (writes resumed everywhere; the directory
            is left without a manifest and never read).
    """
    wait_ms = flush_wait_ms(flush_wait_s)
    root = root.resolve()
    make_directory_durably(root)
    base = latest_checkpoint(root) if incremental else None
    if incremental and base is None:
        raise ValueError(f"no checkpoint under {root} to be incremental to; take a full one first")
    directory = _claim_directory(root)
    checkpoint_id = directory.name
    flush_id = new_flush_id(checkpoint_id)
    shards = range(len(rpc.endpoints))
    try:
        release_jobs(rpc, release)
        flush_replicas(rpc, flush_id, wait_ms)
        pause = pb.PauseWritesRequest(
            checkpoint_id=checkpoint_id, lease_s=lease_s, flush_id=flush_id
        )
        # From the pause on, a restarting shard fails the checkpoint at once: the others
        # hold their writes meanwhile, and a restarted shard holds no pause to go on with.
        paused = rpc.run([ShardCall(k, "PauseWrites", pause) for k in shards], restart_patience_s=0)
        cut = clock_cut(paused)
        request = pb.CheckpointRequest(
            checkpoint_id=checkpoint_id,
            directory=str(directory),
            base_id=base.name if base is not None else "",
            cut=[pb.JobClocks(job=job, applied=clocks) for job, clocks in cut],
        )
        replies = rpc.run(
            [ShardCall(k, "Checkpoint", request) for k in shards], restart_patience_s=0
        )
    except BaseException:  # an interrupted coordinator must not leave shards paused
        _resume_all(rpc, checkpoint_id, flush_id)
        raise
    manifest = Manifest(
        id=checkpoint_id,
        base=base.name if base is not None else None,
        num_shards=len(rpc.endpoints),
        tables=_agreed_tables(replies, rpc.endpoints),
        files={
            reply.shard: [
                FileEntry(f.path, f.table, f.rows, f.bytes, f.sha256) for f in reply.files
            ]
            for reply in replies
        },
    )
    manifest.write(directory)
    try:
        rpc.run(
            [
                ShardCall(
                    k,
                    "CommitCheckpoint",
                    pb.CommitCheckpointRequest(checkpoint_id=checkpoint_id),
                )
                for k in shards
            ],
            restart_patience_s=0,  # nor one that wrote its files: it cannot base on them
        )
    except PSClientError as error:  # the checkpoint is valid; that shard just cannot base on it
        log.warning(
            "checkpoint %s is complete, but a shard did not take the commit: %s",
            checkpoint_id,
            error,
        )
    return directory, manifest


def clock_cut(paused: list[pb.PauseWritesResponse]) -> list[tuple[str, list[int]]]:
    """The clock cut of a checkpoint: per job, each rank's highest clock applied on any shard
    at the pause. Every rank sends each clock to every shard, so a clock one shard has
    applied has reached the others too, unless its rank died mid-send (then those shards
    cannot reach the cut and the checkpoint fails)."""
    cut: dict[str, list[int]] = {}
    for reply in paused:
        for job in reply.jobs:
            clocks = cut.setdefault(job.job, list(job.applied))
            if len(clocks) != len(job.applied):
                raise PSClientError(
                    "(all shards)",
                    Status.FAILED_PRECONDITION,
                    f"shards disagree on the ranks of job {job.job!r}: "
                    f"{len(clocks)} and {len(job.applied)}",
                )
            cut[job.job] = [max(a, b) for a, b in zip(clocks, job.applied)]
    return list(cut.items())


def _claim_directory(root: Path) -> Path:
    """Create the next checkpoint directory; a concurrent coordinator gets the one after."""
    while True:
        directory = root / next_checkpoint_id(root)
        try:
            directory.mkdir()
        except FileExistsError:
            continue
        fsync_directory(root)  # shards' logs will name it: its entry must last
        return directory


def _resume_all(rpc: ShardRPC, checkpoint_id: str, flush_id: str) -> None:
    """Resume every shard's writes after ``checkpoint_id`` failed, saying which shards still
    write its files (their writes resume when the files are written; a hung disk there
    needs that shard restarted)."""
    request = pb.ResumeWritesRequest(checkpoint_id=checkpoint_id, flush_id=flush_id)

    def said(shard: int, reply: pb.ResumeWritesResponse) -> None:  # as each answers: another
        if reply.still_writing:  # shard's failure must not hide it
            log.warning(
                "shard %s still writes the files of failed checkpoint %s: its writes are "
                "held until they are written (restart the shard if its disk hangs)",
                rpc.endpoints[shard], checkpoint_id,
            )  # fmt: skip

    try:
        # A restarting shard holds no pause to resume.
        calls = [ShardCall(k, "ResumeWrites", request) for k in range(len(rpc.endpoints))]
        rpc.run(calls, said, restart_patience_s=0)
    except PSClientError as error:  # the shard's lease resumes it anyway
        log.warning("could not resume writes after a failed checkpoint: %s", error)


def _agreed_tables(replies: list[pb.CheckpointResponse], endpoints: list[str]) -> list[TableSpec]:
    """The tables every shard reported; shards that disagree mean a broken cluster."""
    specs = [
        sorted((TableSpec.from_proto(t) for t in reply.tables), key=lambda s: s.name)
        for reply in replies
    ]
    for k, reply in enumerate(replies):
        if (reply.shard, reply.num_shards) != (k, len(endpoints)) or specs[k] != specs[0]:
            raise PSClientError(
                endpoints[k],
                Status.FAILED_PRECONDITION,
                f"shard {reply.shard} of {reply.num_shards} reports tables "
                f"{[s.name for s in specs[k]]}, shard 0 {[s.name for s in specs[0]]}; "
                "the cluster disagrees with itself, checkpoint abandoned",
            )
    return specs[0]
