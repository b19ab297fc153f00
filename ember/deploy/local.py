"""The cluster file as local processes: Redis, the shards, and the trainer job under torchrun."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Self

from ember.deploy.cluster_file import ClusterSpec
from ember.deploy.redis_process import RedisProcess, free_port
from ember.deploy.topology import Placement, shard_config, trainer_module_args
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.security.credentials import TOKEN_ENV
from ember.ps_server.shard.config import ShardConfig
from ember.settings import settings_argv, settings_env_names
from ember.trainer.config import TrainConfig

_TRAINER_GRACE_S = 30.0
# Set per shard by LocalCluster itself.
_PER_SHARD = ("shard", "num_shards", "host", "port")


def file_only_environment() -> dict[str, str]:
    """This process's environment without the variables of any setting or the token, so that
    the cluster file alone configures the processes (as in the containers, which inherit
    none)."""
    settings = settings_env_names(ShardConfig, ClientConfig, TrainConfig) | {TOKEN_ENV}
    return {name: value for name, value in os.environ.items() if name not in settings}


class LocalDeployment:
    """Starts a cluster spec's Redis and shards on loopback; runs its trainer job on demand.

    Args:
        spec: the cluster.
        workdir: where Redis's data, the shards' WAL, checkpoints and logs, and the
            trainer's log and report go (created).

    Example:
        >>> with LocalDeployment(load_cluster_file(path), Path("run")) as cluster:  # doctest: +SKIP
        ...     status = cluster.run_trainer()
    """

    def __init__(self, spec: ClusterSpec, workdir: Path) -> None:
        spec.validate()
        self.spec = spec
        self.workdir = workdir.resolve()
        self.redis: RedisProcess | None = None
        self.shards: LocalCluster | None = None
        self._stack = contextlib.ExitStack()
        # Shards pick free metrics ports (their ready files say which); the ranks take
        # consecutive ones from a free base.
        trainer_metrics = free_port() if spec.metrics and spec.trainer else 0
        self._placement = Placement("127.0.0.1", 0, "", str(self.workdir), 0, trainer_metrics)

    @property
    def endpoints(self) -> list[str]:
        """The shards' endpoints, in shard order."""
        assert self.shards is not None, "not started"
        return self.shards.endpoints

    @property
    def placement(self) -> Placement:
        """Where this cluster's processes run (Redis's address once started)."""
        return self._placement

    @property
    def run_dir(self) -> Path:
        """The trainer job's run directory."""
        return Path(self._placement.run_dir)

    def __enter__(self) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            if self.spec.redis is not None:
                redis_dir = self.workdir / "redis"
                redis_dir.mkdir(exist_ok=True)
                self.redis = self._stack.enter_context(RedisProcess(redis_dir, append_only=True))
                self._placement = dataclasses.replace(
                    self._placement, redis_address=self.redis.address
                )
            for directory in ("wal", "checkpoints"):
                (self.workdir / directory).mkdir(exist_ok=True)
            self.shards = self._stack.enter_context(
                LocalCluster(
                    self.spec.shards, self.shard_flags(), workdir=self.workdir / "shards",
                    env=file_only_environment(),
                )
            )  # fmt: skip
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def shard_flags(self) -> list[str]:
        """The ``ember ps`` flags of every shard but those LocalCluster sets per shard."""
        return settings_argv(shard_config(self.spec, 0, self._placement), skip=_PER_SHARD)

    def run_trainer(self) -> int:
        """Run the trainer job to its end (output in ``trainer.log``); its exit status. If this
        is interrupted (a signal), the job's process group gets SIGTERM, as torchrun passes on
        to its ranks, and SIGKILL after :data:`_TRAINER_GRACE_S`."""
        assert self.spec.trainer is not None, "the cluster file has no [trainer]"
        args = trainer_module_args(self.spec, self.endpoints, self._placement)
        # Each rank's OpenMP threads would spin against the shards' on a small machine.
        env = {**file_only_environment(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        with open(self.workdir / "trainer.log", "ab") as log:
            job = subprocess.Popen(
                [sys.executable, *args], stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
            )  # fmt: skip
        try:
            return job.wait()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):  # the job may have ended already
                os.killpg(job.pid, signal.SIGTERM)
            try:
                job.wait(timeout=_TRAINER_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(job.pid, signal.SIGKILL)
                job.wait()
            raise
