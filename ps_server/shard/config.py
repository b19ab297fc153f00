"""Typed configuration of a shard process."""

from __future__ import annotations

import dataclasses

from ember.ps_server.durability.write_log import FSYNC_POLICIES
from ember.ps_server.stores import check_store_url
from ember.ps_server.wire.messages import DEFAULT_MAX_MESSAGE_BYTES

from ember.env import dataclass_from_env


@dataclasses.dataclass(frozen=True)
class ShardConfig:
    """How one shard process serves.

    Attributes:
        shard: this shard's index, 0-based.
        num_shards: number of shards in the cluster.
        host: address to bind.
        port: port to bind; 0 picks a free one (reported in the ready file).
        workers: gRPC handler threads. A step request that waits for other ranks
            (see the .proto's clocks) holds one while it waits.
        max_message_bytes: largest request or reply.
        dedup_window: recent push request ids remembered per table.
        torch_threads: intra-op threads of the shard's tensor ops. Shard work
            is memory-bound and requests already run on ``workers`` threads;
            more intra-op threads mostly spin, stealing cores from the
            handlers (and, on one machine, from trainers).
        store: where table rows live: ``memory``, a ``redis://`` / ``rediss://``
            URL, or ``tiered+redis://...?capacity=ROWS`` (see ``open_store``).
        restore: a checkpoint directory, or a root whose newest checkpoint is
            restored before serving ('' for none); any shard count.
        wal: write-ahead log directory ('' for none): every write request is
            logged before it is applied and acknowledged; at start the shard
            restores the log's base checkpoint and replays the log.
        wal_fsync: ``always`` (fsync before acknowledging, group commit) or
            ``interval`` (fsync every ``wal_fsync_interval_s``).
        wal_fsync_interval_s: fsync period under ``interval``.
        checkpoint_root: the directory checkpoint requests may write under
            ('' refuses them all); paths resolving outside it are refused.
        accept_empty_store: when the Redis behind ``store`` loses this shard's
            rows (restarted without persistence, flushed, replaced) go on from
            initial rows; by default the shard stops serving and says why.
        ucx: also serve the step calls (Lookup, Update) on a UCX listener, advertised
            to clients in the Stats reply (needs ``ember-ps[ucx]``).
        ucx_port: the UCX listener's port; 0 picks a free one.
        ucx_host: the address clients reach the UCX listener at ('' : the same host as
            the gRPC endpoint), e.g. the IPoIB or RoCE address on a host whose gRPC
            address is on another network.
    """

    shard: int = 0
    num_shards: int = 1
    host: str = "127.0.0.1"
    port: int = 0
    workers: int = 32
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    dedup_window: int = 65536
    torch_threads: int = 1
    store: str = "memory"
    restore: str = ""
    wal: str = ""
    wal_fsync: str = "interval"
    wal_fsync_interval_s: float = 0.05
    checkpoint_root: str = ""
    accept_empty_store: bool = False
    ucx: bool = False
    ucx_port: int = 0
    ucx_host: str = ""

    @classmethod
    def from_env(cls) -> ShardConfig:
        """Defaults overridden by EMBER_SHARD, EMBER_NUM_SHARDS, EMBER_HOST, EMBER_PORT, ..."""
        return dataclass_from_env(cls)

    def validate(self) -> None:
        """Raise ValueError naming the first field out of range."""
        if self.num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {self.num_shards}")
        if not 0 <= self.shard < self.num_shards:
            raise ValueError(f"shard must be in 0..{self.num_shards - 1}, got {self.shard}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if not 0 <= self.ucx_port <= 65535:
            raise ValueError(f"ucx_port must be in 0..65535, got {self.ucx_port}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.max_message_bytes < 1 << 16:
            raise ValueError(f"max_message_bytes must be >= 65536, got {self.max_message_bytes}")
        if self.dedup_window < 1:
            raise ValueError(f"dedup_window must be >= 1, got {self.dedup_window}")
        if self.torch_threads < 1:
            raise ValueError(f"torch_threads must be >= 1, got {self.torch_threads}")
        check_store_url(self.store)
        if self.wal_fsync not in FSYNC_POLICIES:
            raise ValueError(f"wal_fsync must be one of {FSYNC_POLICIES}, got {self.wal_fsync!r}")
        if not self.wal_fsync_interval_s > 0:
            raise ValueError(f"wal_fsync_interval_s must be > 0, got {self.wal_fsync_interval_s}")
        if self.checkpoint_root and not self.checkpoint_root.startswith("/"):
            raise ValueError(
                f"checkpoint_root must be an absolute path, got {self.checkpoint_root!r}"
            )
