"""One shard in process, driven through its step service: the helpers of the unit tests of
clocks, waits and replies."""

import threading

import numpy as np
from ember.ps_server.shard.initializers import initial_rows
from ember.ps_server.shard.server import ParameterServer
from ember.ps_server.shard.step_handlers import StepHandlers
from ember.ps_server.wire.messages import pb
from ember.ps_server.wire.step_codec import (
    StepClockView,
    decode_lookup_request,
    decode_lookup_response,
    decode_update_request,
    decode_update_response,
    encode_lookup_request,
    encode_update_request,
)
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec

from tests.support.reference import ReferenceRow

ADAM = TableSpec("emb", dim=3, optimizer=OptimizerSpec(OptimizerKind.ADAM, lr=0.1))
OTHER = TableSpec("other", dim=2, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=0.5))


def shard() -> ParameterServer:
    server = ParameterServer(0, 1)
    server.create_table(ADAM)
    server.create_table(OTHER)
    return server


def clock(step, rank=0, world=2, mode=pb.EXACT, job="job-a", wait_ms=20_000):
    return StepClockView(job, world, rank, step, mode, wait_ms)


def update(server, step, ids, grads, rank=0, refresh=(), call=None, **kwargs):
    """``(duplicate, refreshed, watermark)`` of an update of table ``emb``."""
    request = encode_update_request(
        [("emb", np.asarray(ids, "<i8"), np.asarray(grads, "<f4"))],
        clock(step, rank, **kwargs),
        [("emb", np.asarray(r, "<i8")) for r in refresh],
    )
    return server.steps.update(decode_update_request(request), call)[:3]


def update_and_read(server, step, ids, grads, read, rank=0, **kwargs):
    """``(watermark, rows of ``read``)`` of an update of table ``emb`` that carries a read of
    ``read`` (its ids), through the handler that writes the reply."""
    request = encode_update_request(
        [("emb", np.asarray(ids, "<i8"), np.asarray(grads, "<f4"))],
        clock(step, rank, **kwargs), read=[("emb", np.asarray(read, "<i8"))],
    )  # fmt: skip
    reply = decode_update_response(StepHandlers(server).update(decode_update_request(request)))
    return reply.watermark, np.frombuffer(reply.rows, "<f4").reshape(len(read), -1)


def lookup(server, ids, step=None, rank=0, **kwargs):
    request = encode_lookup_request(
        [("emb", np.asarray(ids, "<i8"))], None if step is None else clock(step, rank, **kwargs)
    )
    reply = decode_lookup_response(StepHandlers(server).lookup(decode_lookup_request(request)))
    return np.frombuffer(reply.values[0], "<f4").reshape(len(ids), -1), reply.watermark


def in_thread(work, *args, **kwargs):
    result = {}

    def run():
        try:
            result["value"] = work(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - handed to the test
            result["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def reference_rows(ids, steps):
    """Float64 Adam rows of ``ids`` after each gradient of ``steps`` in turn."""
    rows = [ReferenceRow(r, ADAM.optimizer) for r in initial_rows(ADAM, np.asarray(ids)).numpy()]
    for grads in steps:
        for row, grad in zip(rows, grads):
            row.apply(np.asarray(grad))
    return np.stack([row.w for row in rows])
