"""``ember ps``: run one parameter-server shard."""

from __future__ import annotations

import argparse
from pathlib import Path

from ember.env import env_value
from ember.ps_server.shard.config import ShardConfig
from ember.ps_server.wire.messages import DEFAULT_MAX_MESSAGE_BYTES


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``ps`` subcommand."""
    parser = commands.add_parser("ps", help="run one parameter-server shard")
    defaults = ShardConfig.from_env()
    parser.add_argument(
        "--shard", type=int, default=defaults.shard, help="this shard's index (env EMBER_SHARD)"
    )
    parser.add_argument(
        "--num-shards",
        type=int,
        default=defaults.num_shards,
        help="shards in the cluster (env EMBER_NUM_SHARDS)",
    )
    parser.add_argument("--host", default=defaults.host, help="address to bind (env EMBER_HOST)")
    parser.add_argument(
        "--port", type=int, default=defaults.port, help="port; 0 picks a free one (env EMBER_PORT)"
    )
    parser.add_argument(
        "--workers", type=int, default=defaults.workers, help="handler threads (env EMBER_WORKERS)"
    )
    parser.add_argument(
        "--max-message-bytes",
        type=int,
        default=defaults.max_message_bytes,
        help=f"largest request or reply (default {DEFAULT_MAX_MESSAGE_BYTES}; env EMBER_MAX_MESSAGE_BYTES)",
    )
    parser.add_argument(
        "--dedup-window",
        type=int,
        default=defaults.dedup_window,
        help="recent push request ids remembered per table (env EMBER_DEDUP_WINDOW)",
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=defaults.torch_threads,
        help="intra-op threads of tensor ops (env EMBER_TORCH_THREADS)",
    )
    parser.add_argument(
        "--store",
        default=defaults.store,
        help="where rows live: memory, redis://[user:password@]host:port/db, rediss://..., or "
        "tiered+redis://...?capacity=ROWS for a memory tier of ROWS rows in front of Redis "
        "(env EMBER_STORE)",
    )
    parser.add_argument(
        "--restore",
        default=defaults.restore,
        help="restore this checkpoint (or the newest under this root) before serving; the "
        "checkpoint may come from another shard count (env EMBER_RESTORE)",
    )
    parser.add_argument(
        "--wal",
        default=defaults.wal,
        help="write-ahead log directory: log every write before acknowledging it, and at start "
        "restore the log's checkpoint and replay it (env EMBER_WAL)",
    )
    parser.add_argument(
        "--wal-fsync",
        choices=["always", "interval"],
        default=defaults.wal_fsync,
        help="always: fsync before each acknowledgement (group commit); interval: fsync every "
        "--wal-fsync-interval-s (env EMBER_WAL_FSYNC)",
    )
    parser.add_argument(
        "--wal-fsync-interval-s",
        type=float,
        default=defaults.wal_fsync_interval_s,
        help="fsync period under --wal-fsync interval (env EMBER_WAL_FSYNC_INTERVAL_S)",
    )
    parser.add_argument(
        "--checkpoint-root",
        default=defaults.checkpoint_root,
        help="the only directory checkpoint requests may write under; without it the shard "
        "refuses checkpoints (env EMBER_CHECKPOINT_ROOT)",
    )
    parser.add_argument(
        "--accept-empty-store",
        action=argparse.BooleanOptionalAction,
        default=defaults.accept_empty_store,
        help="when Redis loses this shard's rows while it serves (restarted without "
        "persistence, flushed), go on from initial rows instead of refusing to serve "
        "(env EMBER_ACCEPT_EMPTY_STORE)",
    )
    parser.add_argument(
        "--ucx",
        action=argparse.BooleanOptionalAction,
        default=defaults.ucx,
        help="also serve Lookup and Update over UCX, advertised to clients (needs "
        "pip install 'ember-ps[ucx]'; env EMBER_UCX)",
    )
    parser.add_argument(
        "--ucx-port",
        type=int,
        default=defaults.ucx_port,
        help="the UCX listener's port; 0 picks a free one (env EMBER_UCX_PORT)",
    )
    parser.add_argument(
        "--ucx-host",
        default=defaults.ucx_host,
        help="the address clients reach the UCX listener at, e.g. the IPoIB or RoCE address; "
        "default: the host of the gRPC endpoint (env EMBER_UCX_HOST)",
    )
    parser.add_argument(
        "--ready-file",
        type=Path,
        default=env_value("READY_FILE", None, Path),
        help="write {endpoint, shard, num_shards, pid} as JSON here once serving (env EMBER_READY_FILE)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT."""
    from ember.kernels.loader import KernelBuildError
    from ember.ps_server.errors import EmberError
    from ember.ps_server.shard.shard_server import serve_until_signalled
    from ember.ps_server.ucx import UcxUnavailableError

    config = ShardConfig(
        shard=args.shard,
        num_shards=args.num_shards,
        host=args.host,
        port=args.port,
        workers=args.workers,
        max_message_bytes=args.max_message_bytes,
        dedup_window=args.dedup_window,
        torch_threads=args.torch_threads,
        store=args.store,
        restore=args.restore,
        wal=args.wal,
        wal_fsync=args.wal_fsync,
        wal_fsync_interval_s=args.wal_fsync_interval_s,
        checkpoint_root=args.checkpoint_root,
        accept_empty_store=args.accept_empty_store,
        ucx=args.ucx,
        ucx_port=args.ucx_port,
        ucx_host=args.ucx_host,
    )
    try:
        config.validate()
        serve_until_signalled(config, args.ready_file)
    except (ValueError, OSError, EmberError, KernelBuildError, UcxUnavailableError) as error:
        raise SystemExit(f"ember ps: {error}") from None
    return 0
