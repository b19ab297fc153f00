"""The cluster file: one TOML description of a cluster that every launcher runs.

Example (``docker/cluster.toml`` is the one the compose file is made from)::

    shards = 2

    [redis]                 # optional: a Redis server behind the shards
    tier_rows = 100000      # rows each shard keeps in memory in front of it (0: none)

    [durability]
    wal = true              # every shard logs its writes before acknowledging them
    checkpoints = true      # shards accept checkpoint requests under the cluster's directory

    [shard]                 # ShardConfig settings (ember ps --help), but placement
    workers = 8

    [client]                # ClientConfig settings of the cluster's clients
    timeout_s = 60

    [trainer]               # optional: a training job under torchrun
    ranks = 2
    steps = 100             # and TrainConfig settings (ember train --help)

    [monitoring]
    metrics = true          # Prometheus endpoints on every shard and rank

Every table and key is checked: an unknown key or a value of the wrong type is
refused with its key path (:class:`~ember.settings.SettingsError`).
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ember.ps_server.client.config import ClientConfig
from ember.ps_server.shard.config import ShardConfig
from ember.settings import SettingsError, settings_from_mapping
from ember.trainer.config import TrainConfig

# ShardConfig settings that the launchers set for each shard and placement.
PLACED_SHARD_SETTINGS = (
    "shard", "num_shards", "host", "port", "store", "wal", "checkpoint_root", "restore",
    "ucx", "ucx_port", "ucx_host", "tls_cert", "tls_key", "tls_client_ca", "token_file",
    "metrics_port", "metrics_host", "exit_on_fault",
)  # fmt: skip
# ClientConfig settings a cluster file may not give: its shards serve neither TLS, nor a
# token, nor UCX (security and UCX are flags of `ember ps` and `ember train` for now).
PLACED_CLIENT_SETTINGS = ("tls_ca", "tls_cert", "tls_key", "token_file", "transport")
# TrainConfig settings the launchers set.
PLACED_TRAIN_SETTINGS = ("progress", "run_dir", "metrics_port", "metrics_host")
MAX_SHARDS = 64
MAX_RANKS = 64


@dataclasses.dataclass(frozen=True)
class RedisSpec:
    """A Redis server behind the shards: all their rows, or the cold ones behind a memory tier.

    Attributes:
        tier_rows: rows each shard keeps in memory in front of Redis (0: every row in Redis).
    """

    tier_rows: int = 0


@dataclasses.dataclass(frozen=True)
class TrainerSpec:
    """A training job: ``ranks`` processes under torchrun, each with ``train``."""

    ranks: int
    train: TrainConfig


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """A whole cluster, as its file describes it."""

    shards: int
    shard: ShardConfig
    client: ClientConfig
    wal: bool = False
    checkpoints: bool = False
    redis: RedisSpec | None = None
    trainer: TrainerSpec | None = None
    metrics: bool = False

    def validate(self) -> None:
        """Raise ValueError naming the first bad value and its table."""
        if not 1 <= self.shards <= MAX_SHARDS:
            raise ValueError(f"shards must be in 1..{MAX_SHARDS}, got {self.shards}")
        _in_table("shard", self.shard.validate)
        _in_table("client", self.client.validate)
        if self.redis is not None and self.redis.tier_rows < 0:
            raise ValueError(f"redis.tier_rows must be >= 0, got {self.redis.tier_rows}")
        if self.trainer is not None:
            if not 1 <= self.trainer.ranks <= MAX_RANKS:
                raise ValueError(
                    f"trainer.ranks must be in 1..{MAX_RANKS}, got {self.trainer.ranks}"
                )
            _in_table("trainer", self.trainer.train.validate)


def load_cluster_file(path: Path) -> ClusterSpec:
    """The cluster ``path`` describes.

    Raises:
        SettingsError: unreadable TOML, an unknown key or a wrong type (naming its key path),
            or a value out of range (naming the file).
    """
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise SettingsError(f"{path}: {error}") from None
    try:
        spec = cluster_from_mapping(document)
        spec.validate()
    except SettingsError as error:
        raise SettingsError(f"{path}: {error}") from None
    except ValueError as error:
        raise SettingsError(f"{path}: {error}") from None
    return spec


def cluster_from_mapping(document: Mapping[str, Any]) -> ClusterSpec:
    """The cluster a parsed file describes (see the module docstring)."""
    tables = {"shard", "client", "durability", "redis", "trainer", "monitoring"}
    _check_keys(document, "", tables | {"shards"})
    shards = document.get("shards", 1)
    if not isinstance(shards, int) or isinstance(shards, bool):
        raise SettingsError(f"shards: expected int, got {type(shards).__name__} {shards!r}")
    for name in tables:
        if name in document and not isinstance(document[name], Mapping):
            raise SettingsError(f"{name}: expected a table, got {type(document[name]).__name__}")
    durability = _flags(document, "durability", {"wal", "checkpoints"})
    monitoring = _flags(document, "monitoring", {"metrics"})
    redis = None
    if "redis" in document:
        _check_keys(document["redis"], "redis", {"tier_rows"})
        tier_rows = document["redis"].get("tier_rows", 0)
        if not isinstance(tier_rows, int) or isinstance(tier_rows, bool):
            raise SettingsError(f"redis.tier_rows: expected int, got {type(tier_rows).__name__}")
        redis = RedisSpec(tier_rows)
    client = settings_from_mapping(
        ClientConfig, document.get("client", {}), "client", skip=PLACED_CLIENT_SETTINGS
    )
    trainer = None
    if "trainer" in document:
        table = dict(document["trainer"])
        ranks = table.pop("ranks", 1)
        if not isinstance(ranks, int) or isinstance(ranks, bool):
            raise SettingsError(f"trainer.ranks: expected int, got {type(ranks).__name__}")
        train = settings_from_mapping(
            TrainConfig, table, "trainer", skip=PLACED_TRAIN_SETTINGS, endpoints=("unset:0",),
            client=client,
        )  # fmt: skip
        trainer = TrainerSpec(ranks, train)
    return ClusterSpec(
        shards=shards,
        shard=settings_from_mapping(
            ShardConfig, document.get("shard", {}), "shard", skip=PLACED_SHARD_SETTINGS
        ),
        client=client,
        wal=durability.get("wal", False),
        checkpoints=durability.get("checkpoints", False),
        redis=redis,
        trainer=trainer,
        metrics=monitoring.get("metrics", False),
    )


def _flags(document: Mapping[str, Any], name: str, known: set[str]) -> dict[str, bool]:
    """The table ``name`` of on/off keys."""
    table = document.get(name, {})
    _check_keys(table, name, known)
    for key, value in table.items():
        if not isinstance(value, bool):
            raise SettingsError(f"{name}.{key}: expected bool, got {type(value).__name__}")
    return dict(table)


def _in_table(name: str, validate) -> None:
    """Run ``validate``; a ValueError names the table: ``[shard] workers must be >= 4 ...``."""
    try:
        validate()
    except ValueError as error:
        raise ValueError(f"[{name}] {error}") from None


def _check_keys(table: Mapping[str, Any], path: str, known: set[str]) -> None:
    for key in table:
        if key not in known:
            where = f"{path}.{key}" if path else key
            raise SettingsError(f"{where}: unknown key (known: {', '.join(sorted(known))})")
