"""A shard's Prometheus metrics: its calls on both transports, its tables, its clocks and
its write-ahead log.

Calls are counted as they finish (``ember_shard_calls_total``, errors by status in
``ember_shard_call_errors_total``, latency in ``ember_shard_call_seconds``; the
``Checkpoint`` method's latency is how long a checkpoint took). Tables, counters and
clocks are read from the shard when scraped, so nothing on the request path updates them.
Rows and bytes held are exported for memory stores only: counting a Redis-backed table
scans its keys, too much for every scrape (the Stats call still gives them). A scrape
that cannot read the shard still exports the call counters, and
``ember_shard_scrape_errors_total`` says it failed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import grpc
from ember.ps_server.errors import EmberError, status_for
from ember.ps_server.shard.server import ParameterServer
from ember.ps_server.wire.frames import FrameHeader, Op
from ember.ps_server.wire.messages import SERVICE_NAME, pb
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from ember.ps_server.shard.call_watch import CallWatch
    from ember.ps_server.shard.ucx_listener import FrameHandler

log = logging.getLogger(__name__)

_METHODS = {
    f"/{SERVICE_NAME}/{method.name}": method.name
    for method in pb.DESCRIPTOR.services_by_name["ParameterServer"].methods
} | {"/grpc.health.v1.Health/Check": "Health.Check"}

# From a sub-millisecond lookup to a long checkpoint or a lookup held for other ranks.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    120,
)
FSYNC_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)


class ShardMetrics:
    """The metrics of the shard ``logic``, in a registry of their own."""

    def __init__(self, logic: ParameterServer) -> None:
        self.registry = CollectorRegistry()
        labels = ("transport", "method")
        self.calls = Counter(
            "ember_shard_calls", "Calls served, by transport and method", labels,
            registry=self.registry,
        )  # fmt: skip
        self.errors = Counter(
            "ember_shard_call_errors", "Calls answered with an error, by status",
            (*labels, "code"), registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            "ember_shard_call_seconds", "Time to serve a call, by transport and method",
            labels, buckets=LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.wal_fsync = Histogram(
            "ember_shard_wal_fsync_seconds", "Time of each write-ahead log fsync",
            buckets=FSYNC_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.registry.register(_ShardCollector(logic))

    def observe(self, transport: str, method: str, seconds: float, code: str) -> None:
        """Count one finished call (``code`` ``OK`` or its error status)."""
        self.calls.labels(transport, method).inc()
        self.latency.labels(transport, method).observe(seconds)
        if code != "OK":
            self.errors.labels(transport, method, code).inc()

    def grpc_interceptor(self) -> grpc.ServerInterceptor:
        """Counts every gRPC call (put it first: calls refused later are counted too)."""
        return _CallInterceptor(self)

    def frame_handlers(self, handlers: Mapping[Op, FrameHandler]) -> dict[Op, FrameHandler]:
        """``handlers`` of the UCX listener, each counting its calls."""
        return {op: self._timed_frame(op, handler) for op, handler in handlers.items()}

    def _timed_frame(self, op: Op, handler: FrameHandler) -> FrameHandler:
        method = op.name.title()

        def timed(header: FrameHeader, message: memoryview, call: CallWatch) -> bytes:
            start, code = time.perf_counter(), "OK"
            try:
                return handler(header, message, call)
            except EmberError as error:
                code = status_for(error).name
                raise
            except Exception:
                code = "INTERNAL"
                raise
            finally:
                self.observe("ucx", method, time.perf_counter() - start, code)

        return timed


class _CallInterceptor(grpc.ServerInterceptor):
    def __init__(self, metrics: ShardMetrics) -> None:
        self._metrics = metrics

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or handler.request_streaming or handler.response_streaming:
            return handler  # reflection's streams and unknown methods are not counted
        # Only the service's own methods get their name: a caller may send any method name
        # (refused, but still counted), which must not create series without bound.
        method = _METHODS.get(details.method, "other")
        behaviour, metrics = handler.unary_unary, self._metrics

        def counted(request: Any, context: grpc.ServicerContext) -> Any:
            start = time.perf_counter()
            failed = True
            try:
                reply = behaviour(request, context)
                failed = False
                return reply
            finally:
                # An abort sets the status before it raises; anything else raised is UNKNOWN.
                code = context.code() or (grpc.StatusCode.UNKNOWN if failed else grpc.StatusCode.OK)
                metrics.observe("grpc", method, time.perf_counter() - start, code.name)

        return grpc.unary_unary_rpc_method_handler(
            counted, handler.request_deserializer, handler.response_serializer
        )


class _ShardCollector(Collector):
    """Tables, their traffic and the step clocks, read from the shard at each scrape."""

    def __init__(self, logic: ParameterServer) -> None:
        self._logic = logic
        self._sizes = logic.store_url in ("", "memory")
        self._errors = 0

    def collect(self) -> Iterator[Any]:
        try:
            families = list(self._families())
        except Exception as error:  # noqa: BLE001 - a scrape must not fail the call counters
            log.warning("metrics: cannot read the shard's tables and clocks: %s", error)
            self._errors += 1
            families = []
        errors = CounterMetricFamily(
            "ember_shard_scrape_errors", "Scrapes that could not read the tables or clocks"
        )
        errors.add_metric([], self._errors)
        yield from (*families, errors)

    def _families(self) -> Iterator[Any]:
        rows = GaugeMetricFamily("ember_shard_table_rows", "Rows held, by table", labels=["table"])
        size = GaugeMetricFamily(
            "ember_shard_table_bytes", "Bytes of rows and optimizer state held", labels=["table"]
        )
        counters = {
            name: CounterMetricFamily(f"ember_shard_{name}", text, labels=["table"])
            for name, text in (
                ("rows_pulled", "Rows read by pulls and lookups"),
                ("rows_pushed", "Rows updated by pushes and updates"),
                ("push_requests", "Pushes and updates, applied or deduplicated"),
                ("duplicate_pushes", "Push requests deduplicated by request id (not applied)"),
            )
        }
        for table in self._logic.stats(sizes=self._sizes):
            if self._sizes:
                rows.add_metric([table.name], table.rows)
                size.add_metric([table.name], table.bytes)
            for name, family in counters.items():
                family.add_metric([table.name], getattr(table.counters, name))
        watermark = GaugeMetricFamily(
            "ember_shard_watermark", "Highest clock every rank's updates are applied to, by job",
            labels=["job"],
        )  # fmt: skip
        lag = GaugeMetricFamily(
            "ember_shard_clock_lag",
            "Clocks the fastest rank is ahead of the slowest, by job",
            labels=["job"],
        )
        for job, applied in self._logic.steps.clocks.applied_by_job().items():
            watermark.add_metric([job], min(applied))
            lag.add_metric([job], max(applied) - min(applied))
        yield from (rows, size, *counters.values(), watermark, lag, *self._durability())

    def _durability(self) -> Iterator[Any]:
        """The write-ahead log's size since its checkpoint, and the automatic checkpoints."""
        write_log, auto = self._logic.journal.log, self._logic.auto_checkpoints
        if write_log is not None:
            wal = GaugeMetricFamily(
                "ember_shard_wal_bytes",
                "Bytes of write-ahead log since the last checkpoint (what a restart replays)",
            )
            wal.add_metric([], write_log.bytes_since_base)
            yield wal
        if auto is not None:
            taken = CounterMetricFamily(
                "ember_shard_auto_checkpoints",
                "Automatic checkpoints, by result",
                labels=["result"],
            )
            taken.add_metric(["ok"], auto.taken)
            taken.add_metric(["failed"], auto.failed)
            yield taken
