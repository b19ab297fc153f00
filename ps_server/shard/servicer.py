"""The ember.v1.ParameterServer gRPC service over a ParameterServer: requests decoded inside the
error mapping, domain errors as their status codes, and every request refused as retryable
until the shard has recovered its rows."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from ember.ps_server.durability.recovery_progress import RecoveryProgress
from ember.ps_server.errors import (
    CheckpointStateError,
    EmberError,
    InvalidArgumentError,
    ShardRecoveringError,
    marks_restart,
    status_for,
)
from ember.ps_server.shard.call_watch import CallWatch
from ember.ps_server.shard.request_checks import check_request_id
from ember.ps_server.shard.server import ParameterServer, PullStaleReply
from ember.ps_server.shard.step_handlers import StepHandlers
from ember.ps_server.wire.messages import RESTARTING_KEY, SERVICE_NAME, pb, pb_grpc
from ember.ps_server.wire.pull_push_codec import (
    PushRequestView,
    decode_push_request,
    encode_pull_reply,
)
from ember.ps_server.wire.stats import DataPlaneAddress
from ember.ps_server.wire.step_codec import (
    LookupRequestView,
    UpdateRequestView,
    decode_lookup_request,
    decode_update_request,
)
from ember.ps_server.wire.table_spec import TableSpec
from google.protobuf.message import DecodeError

log = logging.getLogger(__name__)


# Methods whose payloads skip the generated classes (see pull_push_codec, step_codec).
_RAW_REQUESTS = {
    "Push": decode_push_request,
    "Lookup": decode_lookup_request,
    "Update": decode_update_request,
}
_RAW_REPLIES = frozenset({"Pull", "Lookup", "Update"})
_GRPC_CODES = {code.value[0]: code for code in grpc.StatusCode}


def method_handlers(servicer: ParameterServerServicer) -> grpc.GenericRpcHandler:
    """A handler per method of the service, as the proto declares it. Requests arrive as bytes
    and are decoded inside the error mapping, so a malformed one is INVALID_ARGUMENT; until
    ``servicer`` is opened, every one is refused as retryable (its shard is recovering)."""
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name["ParameterServer"].methods:
        decode = _RAW_REQUESTS.get(method.name) or _decoder(getattr(pb, method.input_type.name))
        encode = (
            None
            if method.name in _RAW_REPLIES
            else getattr(pb, method.output_type.name).SerializeToString
        )
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            _guarded(servicer, getattr(servicer, method.name), decode),
            request_deserializer=None,
            response_serializer=encode,
        )
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)


def _decoder(message_type: Any) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        try:
            return message_type.FromString(data)
        except DecodeError as error:
            raise InvalidArgumentError(
                f"malformed {message_type.DESCRIPTOR.name}: {error}"
            ) from None

    return decode


def _guarded(
    servicer: ParameterServerServicer,
    method: Callable[[Any, grpc.ServicerContext], Any],
    decode: Callable[[bytes], Any],
):
    """Decode the request and run ``method`` once ``servicer`` is open; domain errors become
    their gRPC status (a restarting shard's marked, see :data:`RESTARTING_KEY`), anything
    else INTERNAL (logged)."""

    @functools.wraps(method)
    def handler(data: bytes, context: grpc.ServicerContext) -> Any:
        try:
            servicer.check_open()
            return method(decode(data), context)
        except EmberError as error:
            if marks_restart(error):
                context.set_trailing_metadata(((RESTARTING_KEY, "1"),))
            context.abort(_GRPC_CODES[status_for(error)], str(error))
        except Exception as error:
            log.exception("%s failed", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"{type(error).__name__}: {error}")

    return handler


class ParameterServerServicer(pb_grpc.ParameterServerServicer):
    """The ember.v1.ParameterServer service over a :class:`ParameterServer`. Served through
    :func:`method_handlers`, it refuses every request as retryable until :meth:`open`: its
    shard is still rebuilding its rows.

    Args:
        server: the shard's logic.
        recovery: how far the shard's recovery has got, said in the refusals.
    """

    def __init__(self, server: ParameterServer, recovery: RecoveryProgress | None = None) -> None:
        self.server = server
        self.steps = StepHandlers(server)
        self.data_planes: list[DataPlaneAddress] = []
        self._recovery = recovery or RecoveryProgress()
        self._open = False

    def open(self, data_planes: Sequence[DataPlaneAddress] = ()) -> None:
        """The shard has recovered: serve requests, offering ``data_planes`` for step calls."""
        self.data_planes = list(data_planes)
        self._open = True

    def check_open(self) -> None:
        """Refuse a request while the shard is recovering.

        Raises:
            ShardRecoveringError: the shard is still recovering its rows.
        """
        if not self._open:
            raise ShardRecoveringError(
                f"shard {self.server.shard} is recovering its rows ({self._recovery.describe()})"
                " and serves once it has: retry"
            )

    def CreateTable(
        self, request: pb.CreateTableRequest, context: grpc.ServicerContext
    ) -> pb.CreateTableResponse:
        created = self.server.create_table(TableSpec.from_proto(request.spec))
        return pb.CreateTableResponse(created=created)

    def Pull(self, request: pb.PullRequest, context: grpc.ServicerContext) -> bytes:
        """Returns the serialised PullResponse (see pull_push_codec)."""
        reply = self.server.pull(request.table, request.ids, request.with_state)
        return encode_pull_reply(reply.values, reply.versions, reply.dim, reply.state)

    def Push(self, request: PushRequestView, context: grpc.ServicerContext) -> pb.PushResponse:
        """Takes the PushRequest as decoded by the zero-copy codec (see pull_push_codec)."""
        check_request_id(request.request_id, "push")
        duplicate, rows = self.server.push(
            request.table, request.ids, request.grads, request.request_id
        )
        return pb.PushResponse(duplicate=duplicate, rows_updated=rows)

    def PullStale(
        self, request: pb.PullStaleRequest, context: grpc.ServicerContext
    ) -> pb.PullStaleResponse:
        reply = self.server.pull_stale(
            request.table, request.ids, request.held_versions, request.bound
        )
        return _pull_stale_response(reply)

    def Assign(self, request: pb.AssignRequest, context: grpc.ServicerContext) -> pb.AssignResponse:
        check_request_id(request.request_id, "assign")
        duplicate = self.server.assign(
            request.table,
            request.ids,
            request.values,
            request.state,
            request.request_id,
            request.versions,
        )
        return pb.AssignResponse(duplicate=duplicate)

    def PullBatch(
        self, request: pb.PullBatchRequest, context: grpc.ServicerContext
    ) -> pb.PullBatchResponse:
        replies = self.server.pull_batch(
            [(sub.table, sub.ids, sub.with_state) for sub in request.requests]
        )
        return pb.PullBatchResponse(
            responses=[
                pb.PullResponse(
                    values=r.values.tobytes(),
                    versions=r.versions.tobytes(),
                    dim=r.dim,
                    state=r.state.tobytes(),
                )
                for r in replies
            ]
        )

    def PushBatch(
        self, request: pb.PushBatchRequest, context: grpc.ServicerContext
    ) -> pb.PushBatchResponse:
        for sub in request.requests:
            check_request_id(sub.request_id, "push")
        outcomes = self.server.push_batch(
            [(s.table, s.ids, s.grads, s.request_id) for s in request.requests]
        )
        return pb.PushBatchResponse(
            responses=[pb.PushResponse(duplicate=d, rows_updated=n) for d, n in outcomes]
        )

    def PullStaleBatch(
        self, request: pb.PullStaleBatchRequest, context: grpc.ServicerContext
    ) -> pb.PullStaleBatchResponse:
        replies = self.server.pull_stale_batch(
            [(sub.table, sub.ids, sub.held_versions, sub.bound) for sub in request.requests]
        )
        return pb.PullStaleBatchResponse(responses=[_pull_stale_response(r) for r in replies])

    def Stats(self, request: pb.StatsRequest, context: grpc.ServicerContext) -> pb.StatsResponse:
        tables = [s.to_proto() for s in self.server.stats(sizes=not request.without_sizes)]
        return pb.StatsResponse(
            shard=self.server.shard,
            num_shards=self.server.num_shards,
            tables=tables,
            data_planes=[plane.to_proto() for plane in self.data_planes],
        )

    def ListTables(
        self, request: pb.ListTablesRequest, context: grpc.ServicerContext
    ) -> pb.ListTablesResponse:
        return pb.ListTablesResponse(tables=[spec.to_proto() for spec in self.server.list_tables()])

    def PauseWrites(
        self, request: pb.PauseWritesRequest, context: grpc.ServicerContext
    ) -> pb.PauseWritesResponse:
        self.server.checkpoints.pause(request.checkpoint_id, request.lease_s)
        try:
            jobs = self.server.steps.clocks_at_pause(request.flush_id)
        except CheckpointStateError as error:
            self.server.checkpoints.resume(request.checkpoint_id)
            raise CheckpointStateError(
                f"checkpoint {request.checkpoint_id!r} refused: {error}; retry it"
            ) from None
        return pb.PauseWritesResponse(
            jobs=[
                pb.JobClocks(job=name, applied=job["applied"])
                for name, job in jobs.items()
                if job["mode"] == pb.EXACT  # an async job's clocks are per shard, not cut
            ]
        )

    def ResumeWrites(
        self, request: pb.ResumeWritesRequest, context: grpc.ServicerContext
    ) -> pb.ResumeWritesResponse:
        still_writing = self.server.checkpoints.resume(request.checkpoint_id)
        self.server.steps.replicas.settle(request.flush_id, paused=False)
        return pb.ResumeWritesResponse(still_writing=still_writing)

    def Checkpoint(
        self, request: pb.CheckpointRequest, context: grpc.ServicerContext
    ) -> pb.CheckpointResponse:
        cut = {entry.job: list(entry.applied) for entry in request.cut}
        if len(cut) != len(request.cut):
            raise InvalidArgumentError("the clock cut names a job twice")
        files, specs = self.server.checkpoints.write(
            request.checkpoint_id, request.directory, request.base_id, cut
        )
        return pb.CheckpointResponse(
            shard=self.server.shard,
            num_shards=self.server.num_shards,
            files=[pb.CheckpointFile(**dataclasses.asdict(entry)) for entry in files],
            tables=[spec.to_proto() for spec in specs],
        )

    def CommitCheckpoint(
        self, request: pb.CommitCheckpointRequest, context: grpc.ServicerContext
    ) -> pb.CommitCheckpointResponse:
        self.server.checkpoints.commit(request.checkpoint_id)
        return pb.CommitCheckpointResponse()

    def Lookup(self, request: LookupRequestView, context: grpc.ServicerContext) -> bytes:
        """Takes the LookupRequest as decoded by the step codec; returns the serialised reply."""
        call = None if request.clock is None else _watch(context)  # only clocks wait
        return self.steps.lookup(request, call=call)

    def Update(self, request: UpdateRequestView, context: grpc.ServicerContext) -> bytes:
        """Takes the UpdateRequest as decoded by the step codec; returns the serialised reply."""
        return self.steps.update(request, call=_watch(context))

    def FlushReplicas(
        self, request: pb.FlushReplicasRequest, context: grpc.ServicerContext
    ) -> pb.FlushReplicasResponse:
        flushed = self.server.steps.replicas.request(
            request.flush_id, request.wait_ms, _watch(context)
        )
        return pb.FlushReplicasResponse(
            jobs=[pb.FlushedJob(job=job, clock=clock) for job, clock in flushed.items()]
        )

    def ReplicasFlushed(
        self, request: pb.ReplicasFlushedRequest, context: grpc.ServicerContext
    ) -> pb.ReplicasFlushedResponse:
        """Held until the checkpoint that asked pauses writes (see the .proto)."""
        if request.release:
            self.server.steps.release_replica(request.job)
            return pb.ReplicasFlushedResponse(paused=False)
        paused = self.server.steps.replicas.flushed(
            request.job, request.flush_id, request.clock, request.wait_ms, _watch(context)
        )
        return pb.ReplicasFlushedResponse(paused=paused)


def _watch(context: grpc.ServicerContext) -> CallWatch:
    """A watch that ends when the call does (cancelled, past its deadline, disconnected)."""
    call = CallWatch()
    if not context.add_callback(call.end):  # the call has already ended
        call.end()
    return call


def _pull_stale_response(reply: PullStaleReply) -> pb.PullStaleResponse:
    return pb.PullStaleResponse(
        positions=reply.positions.astype("<i8").tobytes(),
        values=reply.values.tobytes(),
        versions=reply.versions.tobytes(),
        dim=reply.dim,
    )
