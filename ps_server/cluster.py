"""A local cluster: N shard processes on free loopback ports.

Used by ``ember cluster up``, ``ember demo``, the integration tests and the
benchmarks. Each shard binds a free port below the kernel's ephemeral range
(:func:`restartable_port`), so a shard restarted on it finds it free, and
announces its endpoint through a ready file, so nothing waits on a fixed sleep.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

from ember.ps_server.local_ports import restartable_port

_READY_TIMEOUT_S = 60.0
_READY_POLL_S = 0.02
# How often a shard is launched on a fresh port when its chosen one was taken meanwhile,
# and what gRPC says then.
_BIND_TRIES = 3
_BIND_FAILED = "Failed to bind to address"


def write_endpoints_file(endpoints: Sequence[str], path: Path) -> None:
    """Write ``{"endpoints": [...]}`` as JSON, atomically (``--endpoints-file`` reads it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"endpoints": list(endpoints)}, indent=2) + "\n")
    os.replace(tmp, path)


class ClusterError(RuntimeError):
    """A shard process failed to start or exited early."""


class LocalCluster:
    """Start ``num_shards`` shard processes; stop them on exit.

    Args:
        num_shards: number of shards.
        extra_args: further ``ember ps`` flags for every shard.
        workdir: where ready files and shard logs go (a temp dir by default).
        host: address the shards bind.
        server_command: the program each shard runs, before its flags; any
            server that accepts the ``ember ps`` flags and writes the ready file.
        env: the shards' environment (default: this process's).

    Example:
        >>> with LocalCluster(2) as cluster:                     # doctest: +SKIP
        ...     client = PSClient(cluster.endpoints)
    """

    def __init__(
        self,
        num_shards: int,
        extra_args: Sequence[str] = (),
        workdir: Path | None = None,
        host: str = "127.0.0.1",
        server_command: Sequence[str] = (sys.executable, "-m", "ember.cli.main", "ps"),
        env: Mapping[str, str] | None = None,
    ) -> None:
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        self.num_shards = num_shards
        self.host = host
        self._extra_args = list(extra_args)
        self._server_command = list(server_command)
        self._env = dict(env) if env is not None else None
        self._tempdir = None if workdir else tempfile.TemporaryDirectory(prefix="ember-cluster-")
        self.workdir = Path(workdir or self._tempdir.name)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.processes: list[subprocess.Popen] = []
        self.endpoints: list[str] = []
        # What each shard's ready file said (endpoint, pid, metrics_port, ...).
        self.ready_info: dict[int, dict] = {}
        self._log_starts: dict[int, int] = {}  # where each shard's latest launch began its log

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> list[str]:
        """Launch every shard and wait until all serve; returns their endpoints."""
        try:
            ports: list[int] = []
            for _ in range(self.num_shards):
                ports.append(restartable_port(self.host, frozenset(ports)))
            ready_files = [self._launch(k, port) for k, port in enumerate(ports)]
            self.endpoints = [
                self._await_first_start(k, f, ports) for k, f in enumerate(ready_files)
            ]
        except BaseException:
            self.stop()
            raise
        return self.endpoints

    def kill_shard(self, shard: int) -> None:
        """SIGKILL shard ``shard`` (a crash: nothing is flushed) and reap it."""
        process = self.processes[shard]
        process.kill()
        process.wait()

    def restart_shard(self, shard: int) -> str:
        """Start a killed or exited shard again on its old port, so clients reconnect.

        Returns:
            Its endpoint (unchanged).
        """
        if self.processes[shard].poll() is None:
            self.kill_shard(shard)
        port = int(self.endpoints[shard].rsplit(":", 1)[1])
        ready = self._launch(shard, port, replace=True)
        self.endpoints[shard] = self._await_ready(shard, ready)
        return self.endpoints[shard]

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM every shard, wait for a graceful exit, SIGKILL stragglers."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for process in self.processes:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes = []
        if self._tempdir is not None:
            self._tempdir.cleanup()
            self._tempdir = None

    def _launch(self, shard: int, port: int, replace: bool = False) -> Path:
        ready = self.workdir / f"shard-{shard}.ready"
        ready.unlink(missing_ok=True)
        command = [
            *self._server_command,
            "--shard", str(shard), "--num-shards", str(self.num_shards),
            "--host", self.host, "--port", str(port), "--ready-file", str(ready),
            *self._extra_args,
        ]  # fmt: skip
        with open(self.workdir / f"shard-{shard}.log", "ab") as log:
            self._log_starts[shard] = log.tell()  # a reused workdir's log holds earlier runs
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=self._env
            )
        if replace:
            self.processes[shard] = process
        else:
            self.processes.append(process)
        return ready

    def _await_first_start(self, shard: int, ready: Path, ports: list[int]) -> str:
        """:meth:`_await_ready`, launching the shard again on another port when another
        process took ``ports[shard]`` between its choice and the bind (a few times)."""
        for _ in range(_BIND_TRIES - 1):
            try:
                return self._await_ready(shard, ready)
            except ClusterError:
                exited = self.processes[shard].poll() is not None  # else it timed out
                if not (exited and ports[shard] and _BIND_FAILED in self._log_tail(shard)):
                    raise
            ports[shard] = restartable_port(self.host, frozenset(ports))
            ready = self._launch(shard, ports[shard], replace=True)
        return self._await_ready(shard, ready)

    def _await_ready(self, shard: int, ready: Path) -> str:
        process = self.processes[shard]
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while not ready.exists():
            if process.poll() is not None:
                raise ClusterError(
                    f"shard {shard} exited with {process.returncode}: {self._log_tail(shard)}"
                )
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"shard {shard} not ready after {_READY_TIMEOUT_S} s: {self._log_tail(shard)}"
                )
            time.sleep(_READY_POLL_S)
        self.ready_info[shard] = json.loads(ready.read_text())
        return self.ready_info[shard]["endpoint"]

    def _log_tail(self, shard: int) -> str:
        """The end of what the shard's latest launch wrote to its log."""
        log = self.workdir / f"shard-{shard}.log"
        if not log.exists():
            return "(no log)"
        with open(log, "rb") as text:
            text.seek(self._log_starts.get(shard, 0))
            return text.read().decode(errors="replace")[-2000:]
