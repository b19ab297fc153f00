"""Mutated requests against a live shard: only clean status codes come back, the shard keeps
serving, and a rejected write changes no row. 600 seeded requests."""

import random

import grpc
import numpy as np
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.shard.server import ParameterServer
from ember.ps_server.wire.messages import SERVICE_NAME, encode_ids, pb
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec
from google.protobuf.message import DecodeError

from tests.support.mutations import mutated

SPEC = TableSpec("fuzzed", dim=4, optimizer=OptimizerSpec(OptimizerKind.ADAGRAD, lr=0.1))
IDS = np.array([0, 5, 9, 1 << 33], dtype=np.int64)
GRADS = np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4)
CLEAN = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
}


def _valid_requests() -> dict[str, bytes]:
    push = pb.PushRequest(
        table=SPEC.name, ids=encode_ids(IDS), grads=GRADS.tobytes(), request_id="p"
    )
    pull = pb.PullRequest(table=SPEC.name, ids=encode_ids(IDS))
    return {
        "Pull": pull.SerializeToString(),
        "Push": push.SerializeToString(),
        "PullBatch": pb.PullBatchRequest(requests=[pull, pull]).SerializeToString(),
        "PushBatch": pb.PushBatchRequest(requests=[push]).SerializeToString(),
        "PullStaleBatch": pb.PullStaleBatchRequest(
            requests=[
                pb.PullStaleRequest(
                    table=SPEC.name, ids=encode_ids(IDS), held_versions=bytes(32), bound=0
                )
            ]
        ).SerializeToString(),
        "Assign": pb.AssignRequest(
            table=SPEC.name, ids=encode_ids(IDS), values=GRADS.tobytes(), request_id="a"
        ).SerializeToString(),
    }


def _apply_to(reference: ParameterServer, method: str, data: bytes) -> set[int]:
    """Replay an accepted write on the in-process reference; returns the ids it names."""
    if method == "Push":
        r = pb.PushRequest.FromString(data)
        reference.push(r.table, r.ids, r.grads, r.request_id)
        return set(np.frombuffer(r.ids, dtype="<i8").tolist())
    if method == "PushBatch":
        batch = pb.PushBatchRequest.FromString(data).requests
        reference.push_batch([(r.table, r.ids, r.grads, r.request_id) for r in batch])
        return {i for r in batch for i in np.frombuffer(r.ids, dtype="<i8").tolist()}
    r = pb.AssignRequest.FromString(data)
    reference.assign(r.table, r.ids, r.values, r.state, r.request_id, r.versions)
    return set(np.frombuffer(r.ids, dtype="<i8").tolist())


def _named_ids(method: str, data: bytes) -> set[int]:
    """The ids a write names, when its bytes parse at all (else it cannot name any)."""
    try:
        if method == "PushBatch":
            batch = pb.PushBatchRequest.FromString(data).requests
        else:
            batch = [(pb.PushRequest if method == "Push" else pb.AssignRequest).FromString(data)]
        return {
            i
            for r in batch
            if len(r.ids) % 8 == 0
            for i in np.frombuffer(r.ids, dtype="<i8").tolist()
            if i >= 0
        }
    except DecodeError:
        return set()


def test_mutated_requests_get_clean_codes_and_rejected_writes_change_nothing():
    valid = _valid_requests()
    reference = ParameterServer(0, 1)
    reference.create_table(SPEC)
    rng = random.Random(5)
    codes, watched = {}, set(IDS.tolist())
    with (
        LocalCluster(1) as cluster,
        PSClient(cluster.endpoints) as client,
        grpc.insecure_channel(cluster.endpoints[0]) as channel,
    ):
        client.create_table(SPEC)
        calls = {name: channel.unary_unary(f"/{SERVICE_NAME}/{name}") for name in valid}
        for _ in range(600):
            method = rng.choice(sorted(valid))
            data = mutated(valid[method], rng)
            try:
                calls[method](data, timeout=30)
                code = grpc.StatusCode.OK
            except grpc.RpcError as error:
                code = error.code()
                assert code in CLEAN, (method, data.hex(), code, error.details())
            codes[code] = codes.get(code, 0) + 1
            if method in ("Push", "PushBatch", "Assign"):
                watched |= _named_ids(method, data)
                if code == grpc.StatusCode.OK:
                    watched |= _apply_to(reference, method, data)
        assert cluster.processes[0].poll() is None  # still running
        ids = np.array(sorted(watched), dtype=np.int64)
        live = client.pull_with_versions(SPEC.name, ids)
    expected = reference.pull(SPEC.name, encode_ids(ids))
    assert np.array_equal(live[1].numpy(), expected.versions)
    assert np.array_equal(live[0].numpy(), expected.values)
    assert codes[grpc.StatusCode.OK] > 50 and codes[grpc.StatusCode.INVALID_ARGUMENT] > 50, codes
