"""What runs where: the processes of a cluster spec, for a placement.

Both launchers (local processes and the compose file) take the shards' and the
trainer's configs and commands from here, so they run the same topology and
differ only in placement: addresses, ports and directories.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ember.deploy.cluster_file import ClusterSpec
from ember.ps_server.shard.config import ShardConfig
from ember.settings import settings_argv
from ember.trainer.config import TrainConfig

REDIS_SERVICE = "redis"
TRAINER_SERVICE = "trainer"


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where the processes of a cluster run.

    Attributes:
        bind_host: the address shards bind.
        port: every shard's port (0: each picks a free one).
        redis_address: ``host:port`` of the Redis server.
        durable_dir: the directory under which WAL, checkpoints and the run directory live.
        shard_metrics_port: every shard's metrics port, where the spec asks for metrics
            (0: each picks a free one).
        trainer_metrics_port: rank 0's metrics port (rank r: this plus r).
    """

    bind_host: str
    port: int
    redis_address: str
    durable_dir: str
    shard_metrics_port: int = 0
    trainer_metrics_port: int = 0

    @property
    def run_dir(self) -> str:
        """The trainer job's run directory."""
        return f"{self.durable_dir}/run"


def shard_service(shard: int) -> str:
    """The service name of shard ``shard``."""
    return f"shard-{shard}"


def store_url(spec: ClusterSpec, placement: Placement) -> str:
    """Where the shards keep rows: memory, Redis, or a memory tier in front of Redis."""
    if spec.redis is None:
        return "memory"
    url = f"redis://{placement.redis_address}/0"
    return f"tiered+{url}?capacity={spec.redis.tier_rows}" if spec.redis.tier_rows else url


def shard_config(spec: ClusterSpec, shard: int, placement: Placement) -> ShardConfig:
    """Shard ``shard``'s config: the file's settings, placed."""
    return dataclasses.replace(
        spec.shard,
        shard=shard,
        num_shards=spec.shards,
        host=placement.bind_host,
        port=placement.port,
        store=store_url(spec, placement),
        wal=f"{placement.durable_dir}/wal" if spec.wal else "",
        checkpoint_root=f"{placement.durable_dir}/checkpoints" if spec.checkpoints else "",
        metrics_port=placement.shard_metrics_port if spec.metrics else None,
        metrics_host=placement.bind_host,
    )


def train_config(spec: ClusterSpec, endpoints: Sequence[str], placement: Placement) -> TrainConfig:
    """The trainer's config, reaching the shards at ``endpoints``, writing its run directory
    under the placement's durable directory (no live progress line: its output is a log)."""
    assert spec.trainer is not None
    return dataclasses.replace(
        spec.trainer.train,
        endpoints=tuple(endpoints),
        client=spec.client,
        progress=False,
        run_dir=placement.run_dir,
        metrics_port=placement.trainer_metrics_port if spec.metrics else None,
        metrics_host=placement.bind_host,
    )


def train_argv(config: TrainConfig) -> list[str]:
    """``ember train`` flags that reproduce ``config`` (its client settings too)."""
    return [
        "--endpoints", ",".join(config.endpoints), *settings_argv(config),
        *settings_argv(config.client),
    ]  # fmt: skip


def trainer_module_args(
    spec: ClusterSpec, endpoints: Sequence[str], placement: Placement
) -> list[str]:
    """The trainer job's arguments after ``python``: every rank under torchrun."""
    assert spec.trainer is not None
    return [
        "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={spec.trainer.ranks}",
        "-m", "ember.cli.main", "--log-level", "WARNING", "train",
        *train_argv(train_config(spec, endpoints, placement)),
    ]  # fmt: skip
