"""A shard process: the gRPC server (with health and reflection), the UCX listener where asked,
recovery before serving (requests meanwhile refused as retryable), and a graceful stop."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc
import torch
from ember.kernels.loader import native_ops_available
from ember.ps_server.durability.auto_checkpoint import AutoCheckpoints, AutoPolicy, auto_directory
from ember.ps_server.durability.fault_exits import FaultExits
from ember.ps_server.durability.recovery import recover
from ember.ps_server.durability.recovery_progress import RecoveryProgress
from ember.ps_server.errors import ShardRestartingError
from ember.ps_server.security.credentials import load_token
from ember.ps_server.security.server import TokenInterceptor, server_credentials
from ember.ps_server.shard.config import EXIT_ON_FAULT, ShardConfig
from ember.ps_server.shard.malloc_tuning import retain_freed_buffers
from ember.ps_server.shard.metrics import ShardMetrics
from ember.ps_server.shard.server import ParameterServer, parameter_server_for
from ember.ps_server.shard.servicer import ParameterServerServicer, method_handlers
from ember.ps_server.shard.step_handlers import StepHandlers
from ember.ps_server.shard.ucx_listener import UcxListener
from ember.ps_server.wire.keepalive import keepalive_options
from ember.ps_server.wire.messages import SERVICE_NAME, message_size_options
from ember.ps_server.wire.stats import DataPlaneAddress
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ember.metrics_endpoint import MetricsEndpoint

log = logging.getLogger(__name__)

# The services whose health the shard reports: the whole server, and its own service.
_HEALTH_SERVICES = ("", SERVICE_NAME)
STOP_GRACE_S = 5.0  # in-flight requests' time to finish as a shard stops
# ... as it stops to restart: every request is refused by then, but waits for clocks end only
# at their deadline or the grace.
RESTART_GRACE_S = 1.0


class ShardServer:
    """A started gRPC server for one shard, with health and reflection.

    Example:
        >>> shard = ShardServer.start(ShardConfig())   # doctest: +SKIP
        >>> shard.endpoint                              # doctest: +SKIP
        '127.0.0.1:40123'
    """

    def __init__(
        self,
        config: ShardConfig,
        logic: ParameterServer,
        grpc_server: grpc.Server,
        port: int,
        health_servicer: health.HealthServicer,
        ucx_listener: UcxListener | None = None,
        metrics_endpoint: MetricsEndpoint | None = None,
        auto_checkpoints: AutoCheckpoints | None = None,
    ) -> None:
        self.config = config
        self.logic = logic
        self.port = port
        self._grpc_server = grpc_server
        self._health = health_servicer
        self._ucx_listener = ucx_listener
        self.metrics_endpoint = metrics_endpoint
        self._auto_checkpoints = auto_checkpoints

    @property
    def endpoint(self) -> str:
        """``host:port`` clients connect to."""
        return f"{self.config.host}:{self.port}"

    @classmethod
    def start(cls, config: ShardConfig) -> ShardServer:
        """Bind, register the services and start them, refusing requests as retryable
        (NOT_SERVING) while the shard recovers its rows; serve once it has."""
        config.validate()
        config.check_ucx_trust()
        # Read the credentials before recovery, which may take long, so a bad file fails fast.
        token = load_token(config.token_file)
        credentials = (
            server_credentials(config.tls_cert, config.tls_key, config.tls_client_ca)
            if config.tls_cert
            else None
        )
        torch.set_num_threads(config.torch_threads)
        retain_freed_buffers(config.max_message_bytes)
        native_ops_available()  # build or load the native ops before the first request waits on it
        logic = parameter_server_for(config)
        if config.exit_on_fault:
            logic.fault.supervise()  # before recovery: a fault from now on ends the process
        # Only a shard that serves metrics pays for counting calls. The endpoint is bound
        # before recovery, so that a taken port fails fast.
        metrics = ShardMetrics(logic) if config.metrics_port is not None else None
        endpoint = (
            MetricsEndpoint(metrics.registry, config.metrics_host, config.metrics_port)
            if metrics is not None
            else None
        )
        ucx_listener = grpc_server = None
        try:
            # Bound before recovery, which may take long: a taken port fails fast, and clients
            # hear that the shard is recovering (retryable), not that nothing listens.
            counting = [metrics.grpc_interceptor()] if metrics is not None else []
            progress = RecoveryProgress()
            servicer = ParameterServerServicer(logic, progress)
            grpc_server, port, health_servicer = cls._start_grpc(
                config, servicer, [*counting, *_token_check(token)], credentials
            )
            log.info(
                "shard %d/%d listening on %s:%d, refusing requests (retryable) until it has "
                "recovered", config.shard, config.num_shards, config.host, port,
            )  # fmt: skip
            recover(logic, config, progress)
            if metrics is not None and logic.journal.log is not None:
                logic.journal.log.on_fsync = metrics.wal_fsync.observe
            ucx_listener = _start_ucx_listener(config, logic, metrics, token)
            servicer.open(_data_planes(config, ucx_listener))
            report = _health_reporter(health_servicer, logic)
            logic.fault.on_trip(report)
            report(None)  # before the automatic checkpoints, whose failure reports NOT_SERVING
            auto = _start_auto_checkpoints(config, logic, report)
        except BaseException:
            if grpc_server is not None:
                grpc_server.stop(0).wait()
            if ucx_listener is not None:
                ucx_listener.close(grace_s=0)
            if endpoint is not None:
                endpoint.close()
            raise
        log.info(
            "shard %d/%d serving on %s:%d (%s)", config.shard, config.num_shards, config.host,
            port, _security(config, token),
        )  # fmt: skip
        if token and credentials is not None and ucx_listener is not None:
            log.warning(
                "UCX connections present the token unencrypted (--ucx-unencrypted): whoever "
                "reads the fabric can take it and call the TLS gRPC service with it"
            )
        if token and credentials is None:
            log.warning(
                "the token travels without TLS: anyone on the path can read it (--tls-cert)"
            )
        elif credentials is not None and not (token or config.tls_client_ca):
            log.warning("TLS without a token or mutual TLS encrypts calls but admits anyone")
        return cls(config, logic, grpc_server, port, health_servicer, ucx_listener, endpoint, auto)

    @staticmethod
    def _start_grpc(
        config: ShardConfig,
        servicer: ParameterServerServicer,
        interceptors: list[grpc.ServerInterceptor],
        credentials: grpc.ServerCredentials | None,
    ) -> tuple[grpc.Server, int, health.HealthServicer]:
        """The gRPC server serving ``servicer``, started with its health NOT_SERVING (the
        servicer refuses requests until it is opened)."""
        grpc_server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="ember-ps"),
            # No SO_REUSEPORT (gRPC's default on Linux): a second process on the port would
            # silently take a share of the connections instead of failing to start.
            options=message_size_options(config.max_message_bytes)
            + keepalive_options(config.keepalive_s, server=True)
            + [("grpc.so_reuseport", 0)],
            interceptors=interceptors,
        )
        grpc_server.add_generic_rpc_handlers((method_handlers(servicer),))
        health_servicer = health.HealthServicer()
        for service in _HEALTH_SERVICES:
            health_servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, grpc_server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), grpc_server
        )
        address = f"{config.host}:{config.port}"
        if credentials is not None:
            port = grpc_server.add_secure_port(address, credentials)
        else:
            port = grpc_server.add_insecure_port(address)
        if port == 0:
            raise OSError(f"cannot bind {config.host}:{config.port}")
        grpc_server.start()
        return grpc_server, port, health_servicer

    def write_ready_file(self, path: Path) -> None:
        """Atomically write ``{"endpoint", "shard", "num_shards", "pid"}`` as JSON to ``path``."""
        info = {
            "endpoint": self.endpoint,
            "shard": self.config.shard,
            "num_shards": self.config.num_shards,
            "pid": os.getpid(),
            "metrics_port": self.metrics_endpoint.port if self.metrics_endpoint else None,
        }
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(info))
        os.replace(tmp, path)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Report NOT_SERVING, finish in-flight requests within ``grace_s``, flush, stop."""
        self._health.enter_graceful_shutdown()
        stopped = self._grpc_server.stop(grace_s)  # both transports drain at once
        if self._ucx_listener is not None:
            self._ucx_listener.close(grace_s)
        stopped.wait()
        if self._auto_checkpoints is not None:
            self._auto_checkpoints.close()
        self.logic.flush()
        self.logic.journal.close()
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.close()

    def wait(self) -> None:
        """Block until the server stops."""
        self._grpc_server.wait_for_termination()


def _health_reporter(
    health_servicer: health.HealthServicer, logic: ParameterServer
) -> Callable[[str | None], None]:
    """Sets the health of every service: SERVING when told None and the shard has not failed,
    else NOT_SERVING (told a reason: the shard failed, or cannot checkpoint itself). Make
    one per shard: its lock orders a fault's report after any stale SERVING."""

    lock = threading.Lock()  # a fault's report never lands before a stale SERVING

    def report(reason: str | None) -> None:
        with lock:
            serving = reason is None and logic.fault.reason is None
            status = health_pb2.HealthCheckResponse.SERVING if serving else (
                health_pb2.HealthCheckResponse.NOT_SERVING
            )  # fmt: skip
            for service in _HEALTH_SERVICES:
                health_servicer.set(service, status)

    return report


def _start_auto_checkpoints(
    config: ShardConfig, logic: ParameterServer, report: Callable[[str | None], None]
) -> AutoCheckpoints | None:
    """The shard's own checkpointing thread, started, where ``config`` asks for one."""
    if not config.auto_checkpoints:
        return None
    root = Path(os.path.realpath(config.checkpoint_root))
    auto = AutoCheckpoints(
        logic,
        logic.journal.log,
        auto_directory(root, config.shard, config.num_shards),
        AutoPolicy(config.wal_max_bytes, config.checkpoint_interval_s, config.checkpoint_keep),
        report,
    )
    auto.start()
    logic.auto_checkpoints = auto
    return auto


def _token_check(token: bytes | None) -> list[grpc.ServerInterceptor]:
    return [TokenInterceptor(token)] if token else []


def _security(config: ShardConfig, token: bytes | None) -> str:
    """How calls are protected, for the log."""
    tls = "mutual TLS" if config.tls_client_ca else "TLS" if config.tls_cert else "plaintext"
    return f"{tls}, {'token required' if token else 'no token'}"


def _data_planes(config: ShardConfig, ucx_listener: UcxListener | None) -> list[DataPlaneAddress]:
    """What the shard offers for step calls besides gRPC."""
    if ucx_listener is None:
        return []
    return [DataPlaneAddress("ucx", config.ucx_host, ucx_listener.port, config.max_message_bytes)]


def _start_ucx_listener(
    config: ShardConfig, logic: ParameterServer, metrics: ShardMetrics | None, token: bytes | None
) -> UcxListener | None:
    """The UCX listener of the step calls, where ``config`` asks for one (its calls counted
    where ``metrics`` are kept; every connection presenting ``token`` where given)."""
    if not config.ucx:
        return None
    handlers = StepHandlers(logic).frame_handlers()
    if metrics is not None:
        handlers = metrics.frame_handlers(handlers)
    listener = UcxListener(
        handlers, config.max_message_bytes, config.workers, config.ucx_port, token
    )
    log.info("shard %d serving step calls over UCX on port %d", config.shard, listener.port)
    if config.host not in ("0.0.0.0", "::"):
        log.warning(
            "the UCX listener on port %d accepts connections on every interface, not only %s "
            "(UCX binds no single address): shield the port", listener.port, config.host,
        )  # fmt: skip
    return listener


def serve_until_signalled(config: ShardConfig, ready_file: Path | None = None) -> int:
    """Run a shard until SIGTERM or SIGINT (or, with ``exit_on_fault``, a fault its restart
    repairs: see :func:`_exits_for_restart`), then shut down gracefully; returns the
    process's exit status (:data:`EXIT_ON_FAULT` after such a fault, else 0). A shard that
    must wait for an operator instead blocks, without serving, until signalled (any exit
    would have its supervisor start it again)."""
    stop = threading.Event()
    try:
        shard = ShardServer.start(config)
    except ShardRestartingError as error:  # a fault its restart repairs, as it started
        _on_signals(stop)
        refusal = FaultExits(Path(config.wal), config.shard).take()
        if refusal is None:
            log.error("%s; exiting with status %d for a restart", error, EXIT_ON_FAULT)
            return EXIT_ON_FAULT
        return _wait_for_an_operator(stop, f"{error}; not restarting again: {refusal}")
    _on_signals(stop)
    fault = shard.logic.fault
    if config.exit_on_fault:

        def say_it_stays(_: str) -> None:  # before the request that tripped it is refused
            if not fault.restarting:
                log.error(
                    "shard %d stays up, refusing (--exit-on-fault): a restart does not repair "
                    "this fault; an operator must", config.shard,
                )  # fmt: skip

        fault.on_trip(say_it_stays)
    if ready_file is not None:
        shard.write_ready_file(ready_file)
    restart = False
    # A bounded wait keeps the main thread responsive to signals, and watches the fault.
    while not stop.wait(timeout=0.5):
        if fault.restarting and _exits_for_restart(shard, config):
            restart = True
            break
    log.info("shard %d stopping%s", config.shard, " to restart" if restart else "")
    shard.stop(RESTART_GRACE_S if restart else STOP_GRACE_S)
    if restart and not fault.restarting:  # a fault for an operator came as it stopped
        return _wait_for_an_operator(stop, str(fault.reason))
    return EXIT_ON_FAULT if restart else 0


def _on_signals(stop: threading.Event) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())


def _wait_for_an_operator(stop: threading.Event, reason: str) -> int:
    """Block until signalled, saying why (the shard does not serve); the exit status then."""
    log.error("the shard waits for an operator, not serving, until stopped: %s", reason)
    stop.wait()
    return 1


def _exits_for_restart(shard: ShardServer, config: ShardConfig) -> bool:
    """Whether the shard, stopped on a fault its restart repairs, exits for its supervisor:
    within its budget of fault exits (:class:`FaultExits`), once what its log holds is
    durable (while requests are still refused; it keeps the log's lock). Otherwise the fault
    becomes one for an operator, said in the log, and the shard stays up, refusing."""
    fault = shard.logic.fault
    refusal = FaultExits(Path(config.wal), config.shard).take()
    if refusal is not None:
        fault.trip(f"not restarting again: {refusal}")  # needs an operator from now on
    else:
        shard.logic.journal.close(release_lock=False)  # a failed fsync: for an operator
    if not fault.restarting:
        log.error("shard %d stays up, refusing: %s", config.shard, fault.reason)
        return False
    log.error(
        "shard %d exits with status %d so that its supervisor starts it again; it then "
        "rebuilds its rows from its checkpoint and write-ahead log", config.shard, EXIT_ON_FAULT,
    )  # fmt: skip
    return True
