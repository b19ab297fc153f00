"""A checkpoint coordinator's side of replica flushes (see FlushReplicas in the .proto): ask
the jobs that train hot-row replicas to write them back before writes pause, release jobs
that died holding them. (Each shard checks at the pause that every such job is at its
flush.)"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from ember.ps_server.client.shard_rpc import ShardCall, ShardRPC
from ember.ps_server.shard.step_clocks import MAX_WAIT_MS
from ember.ps_server.wire.messages import pb


def flush_wait_ms(wait_s: float) -> int:
    """``wait_s`` as the wire carries it.

    Raises:
        ValueError: not in (0, 3600] seconds.
    """
    if not 0 < wait_s <= MAX_WAIT_MS / 1000:
        raise ValueError(f"flush_wait_s must be in (0, {MAX_WAIT_MS // 1000}], got {wait_s}")
    return max(1, round(wait_s * 1000))


def new_flush_id(checkpoint_id: str) -> str:
    """A flush id new for this attempt (checkpoint ids repeat across roots)."""
    return f"{checkpoint_id}-{uuid.uuid4().hex}"


def release_jobs(rpc: ShardRPC, jobs: Sequence[str]) -> None:
    """Stop counting ``jobs`` as holding replicas on every shard (jobs whose trainers died:
    their rows since the last write-back are lost with them)."""
    calls = [
        ShardCall(k, "ReplicasFlushed", pb.ReplicasFlushedRequest(job=job, release=True))
        for job in jobs
        for k in range(len(rpc.endpoints))
    ]
    if calls:
        rpc.run(calls)


def flush_replicas(rpc: ShardRPC, flush_id: str, wait_ms: int) -> None:
    """Ask every replica job to write its hot rows back; returns once every shard has had
    every job it counts report (each report is then held until the pause)."""
    request = pb.FlushReplicasRequest(flush_id=flush_id, wait_ms=wait_ms)
    rpc.run(
        [ShardCall(k, "FlushReplicas", request, wait_ms / 1000) for k in range(len(rpc.endpoints))]
    )
