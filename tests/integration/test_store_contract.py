"""One contract for every row store: memory, Redis and tiered (real redis-servers).

The tiered store runs with a memory tier of 16 rows, so most tests push it
through eviction and write-back.
"""

import numpy as np
import pytest
import redis
import torch
from ember.kernels.optim import apply_rows, state_width
from ember.ps_server.errors import StoreCorruptError, StoreUnavailableError
from ember.ps_server.stores import RowBatch, open_store
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec

from tests.support.redis_server import RedisServer, require_redis_server

DIM = 8
ADAM = OptimizerSpec(OptimizerKind.ADAM, lr=0.05)
WIDTH = state_width(ADAM.kind, DIM)


TIER_ROWS = 16


@pytest.fixture(params=["memory", "redis", "tiered"])
def store(request, table_name):
    url = "memory"
    if request.param != "memory":
        url = request.getfixturevalue("redis_server").url
    if request.param == "tiered":
        url = f"tiered+{url}?capacity={TIER_ROWS}"
    return open_store(url, table_name, shard=0, dim=DIM, state_width=WIDTH)


def random_rows(count: int, seed: int) -> RowBatch:
    generator = torch.Generator().manual_seed(seed)
    return RowBatch(
        weights=torch.randn(count, DIM, generator=generator),
        state=torch.rand(count, WIDTH, generator=generator),
        versions=torch.randint(0, 100, (count,), generator=generator),
    )


def assert_one_adam_step(store, ids: np.ndarray, rows: RowBatch) -> None:
    """``store.update`` of ``ids`` holding ``rows`` equals one reference Adam step, state included."""
    grads = torch.randn(len(ids), DIM)
    expected_w, expected_s, steps = rows.weights.clone(), rows.state.clone(), rows.versions + 1
    apply_rows(ADAM, expected_w, expected_s, grads, steps)
    store.update(ids, grads, ADAM)
    _, got = store.fetch(ids)
    torch.testing.assert_close(got.weights, expected_w, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got.state, expected_s, rtol=1e-6, atol=1e-7)
    assert torch.equal(got.versions, steps)


def ids_of(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def test_absent_rows_are_reported_and_zero(store):
    found, rows = store.fetch(ids_of([1, 2**63 - 1]))
    assert not found.any()
    assert not rows.weights.any() and not rows.state.any() and not rows.versions.any()
    assert store.absent(ids_of([1, 5])).all() and store.size() == 0
    state = torch.full((2, WIDTH), float("nan"))
    versions = store.fetch_state(ids_of([1, 5]), state)
    assert versions.tolist() == [0, 0] and not state.any()


def test_inserted_rows_come_back_with_state_and_versions(store):
    ids = ids_of([7, 0, 2**63 - 1, 123456789])
    rows = random_rows(len(ids), seed=1)
    store.insert(ids, rows)
    probe = ids_of([2**63 - 1, 9, 7, 7])  # duplicates and an absent id
    found, got = store.fetch(probe)
    assert found.tolist() == [True, False, True, True]
    for position, source in ((0, 2), (2, 0), (3, 0)):
        assert torch.equal(got.weights[position], rows.weights[source])
        assert torch.equal(got.state[position], rows.state[source])
        assert got.versions[position] == rows.versions[source]
    found, versions = store.fetch_versions(probe)
    assert versions.tolist() == [
        int(rows.versions[2]),
        0,
        int(rows.versions[0]),
        int(rows.versions[0]),
    ]
    state = torch.full((len(probe), WIDTH), float("nan"))  # the absent id's are zeroed
    versions = store.fetch_state(probe, state)  # without weights
    assert versions.tolist() == [rows.versions[2], 0, rows.versions[0], rows.versions[0]]
    assert torch.equal(
        state, torch.stack([rows.state[2], torch.zeros(WIDTH), *[rows.state[0]] * 2])
    )
    assert store.size() == 4
    _, without_state = store.fetch(ids, with_state=False)
    assert without_state.state.shape == (4, 0) and torch.equal(without_state.weights, rows.weights)


def test_insert_overwrites(store):
    ids = ids_of([3, 4])
    store.insert(ids, random_rows(2, seed=1))
    replacement = random_rows(2, seed=2)
    store.insert(ids, replacement)
    assert torch.equal(store.fetch(ids)[1].weights, replacement.weights) and store.size() == 2


def test_update_is_one_optimizer_step_with_state_and_version(store):
    ids = ids_of(range(0, 3000, 3))
    rows = random_rows(len(ids), seed=3)
    store.insert(ids, rows)
    assert_one_adam_step(store, ids, rows)


def test_update_of_an_absent_id_changes_nothing(store):
    store.insert(ids_of([1]), random_rows(1, seed=4))
    before = store.fetch(ids_of([1]))[1]
    with pytest.raises(KeyError):
        store.update(ids_of([1, 2]), torch.ones(2, DIM), ADAM)
    after = store.fetch(ids_of([1]))[1]
    assert torch.equal(after.weights, before.weights) and torch.equal(
        after.versions, before.versions
    )
    assert store.absent(ids_of([2])).all()


def test_batches_larger_than_one_command(store):
    ids = np.random.default_rng(5).permutation(40_000).astype(np.int64) * 7
    rows = random_rows(len(ids), seed=5)
    store.insert(ids, rows)
    found, got = store.fetch(ids[::-1].copy())
    assert found.all() and torch.equal(got.weights, rows.weights.flip(0))
    assert store.size() == len(ids)


def test_empty_batches(store):
    empty = ids_of([])
    store.insert(empty, random_rows(0, seed=6))
    found, rows = store.fetch(empty)
    assert len(found) == 0 and rows.weights.shape == (0, DIM)


def test_tables_and_shards_do_not_share_keys(redis_server, table_name):
    first = open_store(redis_server.url, table_name, 0, DIM, WIDTH)
    other_shard = open_store(redis_server.url, table_name, 1, DIM, WIDTH)
    other_table = open_store(redis_server.url, table_name + "x", 0, DIM, WIDTH)
    first.insert(ids_of([1]), random_rows(1, seed=7))
    assert other_shard.absent(ids_of([1])).all() and other_table.absent(ids_of([1])).all()


def test_wrong_password_is_refused_with_the_url_redacted(tmp_path):
    require_redis_server()
    with RedisServer(tmp_path, password="s3cret") as server:
        url = f"redis://:wrong@127.0.0.1:{server.port}/0"
        with pytest.raises(StoreUnavailableError, match="refused the credentials") as caught:
            open_store(url, "t", 0, DIM, WIDTH)
        assert "wrong" not in str(caught.value) and ":***@" in str(caught.value)
        assert open_store(server.url, "t", 0, DIM, WIDTH).size() == 0  # the right one works


def test_lost_redis_raises_unavailable_and_recovers(tmp_path, table_name):
    require_redis_server()
    server = RedisServer(tmp_path)
    store = open_store(server.url, table_name, 0, DIM, WIDTH)
    store.insert(ids_of([1]), random_rows(1, seed=8))
    server.stop()
    with pytest.raises(StoreUnavailableError, match=f"127.0.0.1:{server.port}.*unreachable"):
        store.fetch(ids_of([1]))
    with pytest.raises(StoreUnavailableError):
        store.insert(ids_of([2]), random_rows(1, seed=9))
    with RedisServer(tmp_path, port=server.port):  # back (empty: no persistence configured)
        rows = random_rows(1, seed=10)
        store.insert(ids_of([2]), rows)
        assert torch.equal(store.fetch(ids_of([2]))[1].weights, rows.weights)


def test_update_creates_absent_rows_with_the_factory_in_one_call(store):
    held = ids_of([1])
    store.insert(held, random_rows(1, seed=11))
    fresh = random_rows(2, seed=12)
    made = []

    def create(new_ids):
        made.append(new_ids.tolist())
        return fresh

    ids = ids_of([5, 1, 9])
    grads = torch.randn(3, DIM)
    expected = RowBatch(
        weights=torch.cat([fresh.weights[:1], store.fetch(held)[1].weights, fresh.weights[1:]]),
        state=torch.cat([fresh.state[:1], store.fetch(held)[1].state, fresh.state[1:]]),
        versions=torch.cat([fresh.versions[:1], store.fetch(held)[1].versions, fresh.versions[1:]])
        + 1,
    )
    apply_rows(ADAM, expected.weights, expected.state, grads, expected.versions)
    store.update(ids, grads, ADAM, create=create)
    assert made == [[5, 9]]
    _, got = store.fetch(ids)
    torch.testing.assert_close(got.weights, expected.weights, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got.state, expected.state, rtol=1e-6, atol=1e-7)
    assert torch.equal(got.versions, expected.versions) and store.size() == 3


def test_evict_drops_rows_and_frees_room(store):
    ids = ids_of(range(100))
    rows = random_rows(100, seed=13)
    store.insert(ids, rows)
    store.evict(ids_of([*range(0, 100, 2), 1000]))  # an absent id is ignored
    assert store.size() == 50
    assert store.absent(ids).tolist() == [i % 2 == 0 for i in range(100)]
    replacement = random_rows(50, seed=14)
    store.insert(ids_of(range(200, 250)), replacement)  # reuses the freed room
    found, got = store.fetch(ids_of(range(1, 100, 2)))
    assert found.all() and torch.equal(got.weights, rows.weights[1::2])
    assert torch.equal(store.fetch(ids_of(range(200, 250)))[1].weights, replacement.weights)
    assert store.size() == 100
    rows, held_bytes = store.footprint()
    assert rows == 100 and held_bytes >= 100 * 4 * (DIM + WIDTH)


def test_dump_yields_every_row_once_and_clear_empties(store):
    ids = np.random.default_rng(15).permutation(3000).astype(np.int64) * 11
    rows = random_rows(len(ids), seed=15)
    store.insert(ids, rows)
    store.update(ids[:10], torch.ones(10, DIM), ADAM)  # some rows hot and changed
    expected = store.fetch(ids)[1]
    chunks = list(store.dump(chunk_rows=700))
    assert all(len(chunk_ids) <= 700 for chunk_ids, _ in chunks)
    dumped_ids = np.concatenate([chunk_ids for chunk_ids, _ in chunks])
    assert sorted(dumped_ids.tolist()) == sorted(ids.tolist())
    order = torch.from_numpy(np.argsort(dumped_ids))
    by_id = torch.from_numpy(np.argsort(ids))
    for field in ("weights", "state", "versions"):
        dumped = torch.cat([getattr(chunk, field) for _, chunk in chunks])
        assert torch.equal(dumped[order], getattr(expected, field)[by_id])
    store.clear()
    assert store.size() == 0 and store.absent(ids).all() and not list(store.dump())


def test_unknown_store_urls_are_refused():
    with pytest.raises(ValueError, match=r"'memory', redis://\.\.\., rediss://") as caught:
        open_store("postgres://user:pw@host/db", "t", 0, DIM, WIDTH)
    assert "pw" not in str(caught.value)
    with pytest.raises(ValueError, match=r"capacity=ROWS") as caught:
        open_store("tiered+redis://:pw@127.0.0.1:1/0?capacity=0", "t", 0, DIM, WIDTH)
    assert "pw" not in str(caught.value)


def test_unreadable_redis_values_are_refused_as_corrupt(redis_server, table_name):
    store = open_store(redis_server.url, table_name, 0, DIM, WIDTH)
    ids = ids_of(range(9000))  # past one decode chunk
    store.insert(ids, random_rows(len(ids), seed=16))
    raw = redis.Redis.from_url(redis_server.url)
    key = f"ember:{table_name}:s0:".encode() + np.int64(8500).tobytes()
    good = raw.get(key)
    raw.set(key, b"XXXX" + good[4:])  # right size, unknown header
    with pytest.raises(StoreCorruptError, match="unknown header"):
        store.fetch(ids)
    with pytest.raises(StoreCorruptError, match="unknown header"):
        store.update(ids, torch.zeros(len(ids), DIM), ADAM)
    raw.set(key, good[:-4])  # another table layout
    with pytest.raises(StoreCorruptError, match=f"{redis_server.port}.*another table layout"):
        store.fetch(ids_of([8500]))
    raw.set(key, good)
    assert torch.equal(store.fetch(ids)[1].weights, random_rows(len(ids), seed=16).weights)


def test_requests_of_several_commands_round_trip_in_one_transaction(redis_server, table_name):
    from ember.ps_server.stores.redis_store import RedisStore

    store = RedisStore(redis_server.url, table_name, 0, DIM, WIDTH, batch_keys=1000)
    ids = np.random.default_rng(17).permutation(50_000)[:4500].astype(np.int64)
    rows = random_rows(len(ids), seed=17)
    store.insert(ids, rows)  # five MSETs inside MULTI/EXEC
    found, got = store.fetch(ids)  # five pipelined MGETs
    assert found.all() and torch.equal(got.weights, rows.weights)
    assert_one_adam_step(store, ids, rows)  # five MGETs, five MSETs in MULTI/EXEC
    store.evict(ids[::2])
    assert store.size() == len(ids) // 2 and store.absent(ids).tolist() == [
        i % 2 == 0 for i in range(len(ids))
    ]
