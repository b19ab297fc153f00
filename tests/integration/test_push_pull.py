"""Push then pull through real shards equals a float64 reference, for every optimizer."""

import dataclasses
import threading

import grpc
import numpy as np
import pytest
import torch
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.routing import shard_of
from ember.ps_server.shard.initializers import initial_rows
from ember.ps_server.wire.messages import encode_ids, pb, pb_grpc
from ember.ps_server.wire.table_spec import InitializerSpec, OptimizerKind, OptimizerSpec, TableSpec

from tests.support.reference import OPTIMIZERS, ReferenceRow


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda s: s.kind.name.lower())
def test_push_then_pull_matches_reference(client, table_name, optimizer):
    spec = TableSpec(table_name, dim=16, optimizer=optimizer)
    client.create_table(spec)
    rng = np.random.default_rng(11)
    universe = rng.choice(2**40, size=300, replace=False)
    start = initial_rows(spec, universe).numpy()
    reference = {int(i): ReferenceRow(start[k], optimizer) for k, i in enumerate(universe)}
    for _ in range(6):
        ids = rng.choice(universe, size=500)  # duplicates are summed before one update per id
        grads = rng.standard_normal((len(ids), spec.dim)).astype(np.float32)
        client.push(table_name, torch.from_numpy(ids), torch.from_numpy(grads))
        summed: dict[int, np.ndarray] = {}
        for i, g in zip(ids.tolist(), grads.astype(np.float64)):
            summed[i] = summed.get(i, 0.0) + g
        for i, g in summed.items():
            reference[i].apply(g)
    query = rng.permutation(np.concatenate([universe, universe[:50]]))
    rows, versions = client.pull_with_versions(table_name, torch.from_numpy(query))
    expected = np.stack([reference[int(i)].w for i in query])
    np.testing.assert_allclose(rows.numpy(), expected, rtol=1e-4, atol=1e-5)
    assert versions.tolist() == [reference[int(i)].steps for i in query]


def test_concurrent_pushes_lose_no_update(client, table_name):
    spec = TableSpec(table_name, dim=8, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=1.0))
    client.create_table(spec)
    ids = np.arange(64, dtype=np.int64) * 9973
    rng = np.random.default_rng(5)
    batches = [
        [(rng.choice(ids, 40), rng.standard_normal((40, 8)).astype(np.float32)) for _ in range(25)]
        for _ in range(4)
    ]
    errors = []

    def pusher(work):
        try:
            with PSClient(client.endpoints) as own:
                for batch_ids, grads in work:
                    own.push(table_name, batch_ids, grads)
        except Exception as error:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=pusher, args=(work,)) for work in batches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    expected = initial_rows(spec, ids).numpy().astype(np.float64)
    position = {int(i): k for k, i in enumerate(ids)}
    for work in batches:
        for batch_ids, grads in work:
            for i, g in zip(batch_ids.tolist(), grads):
                expected[position[i]] -= g
    rows, versions = client.pull_with_versions(table_name, ids)
    np.testing.assert_allclose(rows.numpy(), expected, rtol=1e-4, atol=1e-4)
    updates_per_id = [sum(int(i) in set(b.tolist()) for w in batches for b, _ in w) for i in ids]
    assert versions.tolist() == updates_per_id


def test_pull_is_identical_on_one_two_and_four_shards(table_name):
    spec = TableSpec(table_name, dim=12, initializer=InitializerSpec(seed=99))
    ids = torch.from_numpy(np.random.default_rng(2).choice(2**50, size=5000))
    pulled = []
    for shards in (1, 2, 4):
        with LocalCluster(shards) as cluster, PSClient(cluster.endpoints) as ps:
            ps.create_table(spec)
            pulled.append(ps.pull(table_name, ids))
            assert [t.rows for s in ps.stats() for t in s.tables] == [
                0
            ] * shards  # reads store none
            ps.push(table_name, ids, torch.zeros(len(ids), spec.dim))
            per_shard_rows = [t.rows for s in ps.stats() for t in s.tables]
            assert len(per_shard_rows) == shards and sum(per_shard_rows) == len(set(ids.tolist()))
            assert torch.equal(ps.pull(table_name, ids), pulled[-1])  # a zero SGD step
    assert torch.equal(pulled[0], pulled[1]) and torch.equal(pulled[0], pulled[2])


def test_client_chunks_batches_over_the_message_limit(table_name):
    spec = TableSpec(table_name, dim=64)
    small = 1 << 18  # 256 KiB: a 3000-id pull reply (~780 KB) needs several chunks per shard
    with LocalCluster(2, extra_args=["--max-message-bytes", str(small)]) as cluster:
        config = dataclasses.replace(PSClient(cluster.endpoints).config, max_message_bytes=small)
        with PSClient(cluster.endpoints, config) as ps:
            ps.create_table(spec)
            ids = torch.arange(3000) * 31
            grads = torch.randn(3000, 64)
            ps.push(table_name, ids, grads)
            expected = initial_rows(spec, ids.numpy()) - spec.optimizer.lr * grads
            torch.testing.assert_close(ps.pull(table_name, ids), expected, rtol=1e-5, atol=1e-6)
            pushes = sum(t.counters.push_requests for s in ps.stats() for t in s.tables)
            assert pushes >= 4


def test_pull_stale_returns_only_rows_ahead_by_more_than_the_bound(client, table_name):
    spec = TableSpec(table_name, dim=4, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=1.0))
    client.create_table(spec)
    ids = torch.arange(40) * 7
    _, held = client.pull_with_versions(table_name, ids)
    for times, subset in ((1, ids[:10]), (3, ids[10:20])):
        for _ in range(times):
            client.push(table_name, subset, torch.ones(len(subset), 4))
    for bound, expected in ((0, list(range(20))), (1, list(range(10, 20))), (3, [])):
        positions, stale_rows, versions = client.pull_stale(table_name, ids, held, bound)
        assert positions.tolist() == expected
        fresh_rows, fresh_versions = client.pull_with_versions(table_name, ids[positions])
        assert torch.equal(stale_rows, fresh_rows) and torch.equal(versions, fresh_versions)
    with pytest.raises(ValueError, match="held_versions must have shape"):
        client.pull_stale(table_name, ids, held[:3], 0)


def test_multi_table_calls_match_single_table_calls_and_are_all_or_nothing(client, table_name):
    specs = [
        TableSpec(
            f"{table_name}.{k}", dim=4 + k, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=1.0)
        )
        for k in range(3)
    ]
    for spec in specs:
        client.create_table(spec)
    ids = {spec.name: torch.randint(0, 10_000, (500,)) for spec in specs}
    before = client.pull_many(ids)
    for spec in specs:
        rows, versions = client.pull_with_versions(spec.name, ids[spec.name])
        assert torch.equal(before[spec.name][0], rows) and torch.equal(
            before[spec.name][1], versions
        )
    grads = {spec.name: torch.randn(500, spec.dim) for spec in specs}
    client.push_many({name: (ids[name], grads[name]) for name in ids})
    after = client.pull_many({name: torch.unique(ids[name]) for name in ids})
    for spec in specs:
        unique, inverse = torch.unique(ids[spec.name], return_inverse=True)
        summed = torch.zeros(len(unique), spec.dim).index_add_(0, inverse, grads[spec.name])
        expected = initial_rows(spec, unique.numpy()) - summed
        torch.testing.assert_close(after[spec.name][0], expected, rtol=1e-5, atol=1e-5)
    bad = {spec.name: (ids[spec.name][:5], torch.zeros(5, spec.dim)) for spec in specs}
    bad[specs[2].name] = (ids[specs[2].name][:5], torch.full((5, specs[2].dim), float("nan")))
    with pytest.raises(ValueError, match="NaN or Inf"):
        client.push_many(bad)
    unchanged = client.pull_many({name: torch.unique(ids[name]) for name in ids})
    for name in ids:
        assert torch.equal(unchanged[name][1], after[name][1])


def test_push_batch_is_validated_before_anything_is_applied(cluster, table_name):
    spec = TableSpec(table_name, dim=2, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=1.0))
    ids = np.arange(200, dtype=np.int64)
    mine = encode_ids(ids[shard_of(table_name, ids, 2) == 0][:3])
    with grpc.insecure_channel(cluster.endpoints[0]) as channel:
        stub = pb_grpc.ParameterServerStub(channel)
        stub.CreateTable(pb.CreateTableRequest(spec=spec.to_proto()), timeout=10)
        grads = np.ones((3, 2), np.float32).tobytes()
        good = pb.PushRequest(table=table_name, ids=mine, grads=grads, request_id="a")
        bad = pb.PushRequest(table=table_name, ids=mine, grads=b"\x00" * 5, request_id="b")
        with pytest.raises(grpc.RpcError) as info:
            stub.PushBatch(pb.PushBatchRequest(requests=[good, bad]), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        reply = stub.Pull(pb.PullRequest(table=table_name, ids=mine), timeout=10)
        assert np.frombuffer(reply.versions, dtype=np.int64).tolist() == [0, 0, 0]
