"""Typed configuration of a shard process."""

from __future__ import annotations

import dataclasses

from ember.ps_server.durability.fault_exits import FAULT_EXIT_WINDOW_S, MAX_FAULT_EXITS
from ember.ps_server.durability.log_records import FRAMING
from ember.ps_server.durability.write_log import FSYNC_POLICIES
from ember.ps_server.security.credentials import TOKEN_ENV
from ember.ps_server.shard.replica_flush import MAX_ASKING
from ember.ps_server.stores import check_store_url
from ember.ps_server.wire.keepalive import (
    DEFAULT_KEEPALIVE_S,
    MAX_KEEPALIVE_S,
    MIN_KEEPALIVE_S,
    check_keepalive,
)
from ember.ps_server.wire.messages import DEFAULT_MAX_MESSAGE_BYTES

from ember.settings import setting

# The status a shard exits with when it stops on a fault its restart repairs
# (``exit_on_fault``): EX_TEMPFAIL, "try again".
EXIT_ON_FAULT = 75


@dataclasses.dataclass(frozen=True)
class ShardConfig:
    """How one shard process serves: each field is a setting (flag, EMBER_* variable and
    cluster-file key; see :mod:`ember.settings`), described by its help text."""

    shard: int = setting(0, "this shard's index, 0-based")
    num_shards: int = setting(1, "shards in the cluster")
    host: str = setting("127.0.0.1", "address to bind")
    port: int = setting(0, "port; 0 picks a free one (reported in the ready file)")
    workers: int = setting(
        32,
        "handler threads (gRPC's, and UCX's as many); a step request that waits for other "
        "ranks' clocks holds one while it waits, and a quarter (at least 3) never wait so: "
        "at least 4",
    )
    max_message_bytes: int = setting(
        DEFAULT_MAX_MESSAGE_BYTES, f"largest request or reply (default {DEFAULT_MAX_MESSAGE_BYTES})"
    )
    keepalive_s: float = setting(
        DEFAULT_KEEPALIVE_S,
        "ping a gRPC client this often while it has calls in flight, and drop the connection "
        "(its waits end, its buffered update is withdrawn) when a ping goes unanswered as "
        f"long (at least 5 s); {MIN_KEEPALIVE_S}..{MAX_KEEPALIVE_S:.0f}",
    )
    dedup_window: int = setting(65536, "recent push request ids remembered per table")
    torch_threads: int = setting(
        1,
        "intra-op threads of tensor ops; shard work is memory-bound and already runs on the "
        "handler threads, so more mostly spin and take cores from handlers and trainers",
    )
    store: str = setting(
        "memory",
        "where rows live: memory, redis://[user:password@]host:port/db, rediss://..., or "
        "tiered+redis://...?capacity=ROWS for a memory tier of ROWS rows in front of Redis "
        "(give a password through the environment, not the command line)",
    )
    restore: str = setting(
        "",
        "restore this checkpoint (or the newest under this root) before serving; the "
        "checkpoint may come from another shard count",
    )
    wal: str = setting(
        "",
        "write-ahead log directory: log every write before acknowledging it, and at start "
        "restore the log's checkpoint and replay it",
    )
    wal_fsync: str = setting(
        "interval",
        "always: fsync before each acknowledgement (group commit); interval: fsync every "
        "--wal-fsync-interval-s",
        choices=FSYNC_POLICIES,
    )
    wal_fsync_interval_s: float = setting(0.05, "fsync period under --wal-fsync interval")
    checkpoint_root: str = setting(
        "",
        "the only directory checkpoint requests may write under (absolute); without it the "
        "shard refuses checkpoints",
    )
    wal_max_bytes: int | None = setting(
        None,
        "checkpoint this shard by itself (under --checkpoint-root/auto) once its write-ahead "
        "log holds this many bytes since its last checkpoint: bounds the log on disk and the "
        "replay at restart (README, Durability). At least one record of the largest request "
        "(--max-message-bytes plus a record's framing); off by default",
    )
    checkpoint_interval_s: float | None = setting(
        None,
        "also checkpoint by itself this often, while its log holds anything since its last "
        "checkpoint; off by default",
    )
    checkpoint_keep: int = setting(
        2,
        "automatic checkpoints kept, with the earlier ones their increments need; older "
        "ones are deleted",
    )
    accept_empty_store: bool = setting(
        False,
        "when Redis loses this shard's rows while it serves (restarted without persistence, "
        "flushed), go on from initial rows instead of refusing to serve",
    )
    exit_on_fault: bool = setting(
        False,
        "when the shard stops serving on a fault its restart repairs (its Redis restarted or "
        f"lost its rows, a logged write's outcome in the store is unknown), exit with status "
        f"{EXIT_ON_FAULT}, answering requests UNAVAILABLE meanwhile, so that a supervisor "
        "(compose's restart policy, systemd, Kubernetes) starts it again and it rebuilds its "
        "rows from its checkpoint and write-ahead log (a fault as it starts exits so too). At "
        f"most {MAX_FAULT_EXITS} such exits in {FAULT_EXIT_WINDOW_S / 60:g} minutes (recorded "
        "beside the log), then it waits for an operator; other faults (a failed fsync, a "
        "corrupt store, another process serving this shard) always leave it up, refusing, "
        "for an operator. Needs --wal and a supervisor (ember cluster up has none)",
    )
    ucx: bool = setting(
        False,
        "also serve Lookup and Update over UCX, advertised to clients (needs "
        "pip install 'ember-ps[ucx]')",
    )
    ucx_port: int = setting(0, "the UCX listener's port; 0 picks a free one")
    ucx_host: str = setting(
        "",
        "the address clients reach the UCX listener at, e.g. the IPoIB or RoCE address; "
        "default: the host of the gRPC endpoint",
    )
    metrics_port: int | None = setting(
        None,
        "serve Prometheus metrics at http://METRICS_HOST:PORT/metrics (0: a free port, written "
        "to the ready file); none by default. The endpoint has no authentication: bind it where "
        "only your monitoring reaches it",
    )
    metrics_host: str = setting("127.0.0.1", "address the metrics endpoint binds")
    tls_cert: str = setting(
        "", "PEM certificate to serve TLS with (with --tls-key); clients verify it by its CA"
    )
    tls_key: str = setting("", "PEM private key of --tls-cert")
    tls_client_ca: str = setting(
        "",
        "PEM CA bundle: require mutual TLS, accepting only client certificates it signed "
        "(needs --tls-cert)",
    )
    token_file: str = setting(
        "",
        "file holding the shared token that every call but health must carry; or put the "
        f"token itself in {TOKEN_ENV}",
    )
    ucx_unencrypted: bool = setting(
        False,
        "allow --ucx beside TLS: UCX connections present the token, but it, the rows and the "
        "gradients travel unencrypted (whoever reads the fabric can take the token and call "
        "the TLS gRPC service with it), so only a network you trust may reach the UCX port",
    )

    def validate(self) -> None:
        """Raise ValueError naming the first field out of range."""
        if self.num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {self.num_shards}")
        if not 0 <= self.shard < self.num_shards:
            raise ValueError(f"shard must be in 0..{self.num_shards - 1}, got {self.shard}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port must be in 0..65535, got {self.metrics_port}")
        if not 0 <= self.ucx_port <= 65535:
            raise ValueError(f"ucx_port must be in 0..65535, got {self.ucx_port}")
        if self.workers < 4:
            raise ValueError(
                "workers must be >= 4 (three never wait in a slot: for a checkpoint asking for "
                "replica write-backs, one waiting for its clock cut, and other calls; one for "
                f"a waiting request), got {self.workers}"
            )
        check_keepalive(self.keepalive_s)
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
        self._validate_auto_checkpoints()
        if self.checkpoint_root and not self.checkpoint_root.startswith("/"):
            raise ValueError(
                f"checkpoint_root must be an absolute path, got {self.checkpoint_root!r}"
            )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert and tls_key go together: give both or neither")
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError("tls_client_ca (mutual TLS) needs tls_cert and tls_key")

    @property
    def max_asking(self) -> int:
        """Checkpoints that may wait at once for replica write-backs: each holds a worker
        thread outside the wait slots, which the reports it waits for need (a sixteenth of
        the threads, 1 to MAX_ASKING)."""
        return min(MAX_ASKING, max(1, self.workers // 16))

    @property
    def max_waiting(self) -> int:
        """Requests that may wait at once (for clocks, or held write-back reports), over gRPC
        and UCX together: each holds a worker thread. A quarter of the threads, at least 3,
        never wait in a slot: :attr:`max_asking` of them for checkpoints asking for
        write-backs, and at least two for everything else (one checkpoint at a time waits for
        its clock cut in one; other ranks' updates, health checks and pauses need the rest)."""
        return self.workers - max(3, self.workers // 4)

    @property
    def auto_checkpoints(self) -> bool:
        """Whether the shard checkpoints itself (a log size or an interval is set)."""
        return self.wal_max_bytes is not None or self.checkpoint_interval_s is not None

    def _validate_auto_checkpoints(self) -> None:
        smallest = self.max_message_bytes + FRAMING  # one record of the largest request
        if self.wal_max_bytes is not None and self.wal_max_bytes < smallest:
            raise ValueError(
                f"wal_max_bytes must hold one record of the largest request, {smallest} bytes "
                f"(--max-message-bytes {self.max_message_bytes} plus {FRAMING} of framing); "
                f"got {self.wal_max_bytes}"
            )
        interval = self.checkpoint_interval_s
        if interval is not None and not 0 < interval < float("inf"):
            raise ValueError(f"checkpoint_interval_s must be > 0 and finite, got {interval}")
        if self.checkpoint_keep < 1:
            raise ValueError(f"checkpoint_keep must be >= 1, got {self.checkpoint_keep}")
        if self.exit_on_fault and not self.wal:
            raise ValueError(
                "exit_on_fault needs a write-ahead log (--wal): without one a shard started "
                "again cannot tell a Redis that lost its rows from a new one, and has nothing "
                "to rebuild them from"
            )
        if self.auto_checkpoints and not (self.wal and self.checkpoint_root):
            raise ValueError(
                "automatic checkpoints (wal_max_bytes, checkpoint_interval_s) bound a "
                "write-ahead log and are written under the checkpoint root: give --wal and "
                "--checkpoint-root too"
            )

    def check_ucx_trust(self) -> None:
        """Refuse UCX beside TLS unless ``ucx_unencrypted`` says the network is trusted:
        UCX connections must present the token (where one is set), but UCX has no TLS, so
        rows would leave the encrypted channel."""
        if self.ucx and self.tls_cert and not self.ucx_unencrypted:
            raise ValueError(
                "--ucx beside TLS: the UCX data plane is not encrypted (its connections present "
                "the token, where one is set, but rows and gradients travel in clear). Add "
                "--ucx-unencrypted where only a trusted network reaches the UCX port "
                "(docs/bare-metal-rdma.md, 'Trust boundary')"
            )
