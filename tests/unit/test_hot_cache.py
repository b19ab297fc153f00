import collections

import numpy as np
import pytest
import torch
from ember.trainer.cache.cached_source import CachedRowSource
from ember.trainer.cache.hot_cache import HotEmbeddingCache
from ember.trainer.cache.profiler import cache_bytes_per_row, profile_hot_ids
from ember.trainer.data.batch import Batch, JaggedIds

from tests.support.fake_ps import FakePSClient

DIM = 4


def cached_ids(cache: HotEmbeddingCache) -> set[int]:
    held = set(cache.ids[cache.ids >= 0].tolist())
    assert len(held) == len(cache)
    probe = torch.tensor(sorted(held), dtype=torch.int64)
    assert torch.equal(cache.ids[cache.peek(probe)], probe)  # the index agrees
    return held


def _source(
    policy: str, capacity: int, push_bound: int = 0, pull_bound: int = 0, hot=None, local_lr=0.1
):
    client = FakePSClient(DIM)
    cache = HotEmbeddingCache(
        DIM, capacity, policy, pull_bound, push_bound, local_lr=local_lr, hot_ids=hot
    )
    return client, cache, CachedRowSource(client, {"t": cache})


def _step(
    source: CachedRowSource, ids: list[int], grads: torch.Tensor | None = None
) -> torch.Tensor:
    id_tensor = torch.tensor(sorted(set(ids)), dtype=torch.int64)
    rows = source.rows({"t": id_tensor})["t"]
    if grads is None:
        grads = torch.zeros(len(id_tensor), DIM)
    source.apply_gradients({"t": (id_tensor, grads)})
    return rows


class _ReferenceLRU:
    def __init__(self, capacity):
        self.capacity, self.entries = capacity, collections.OrderedDict()

    def access(self, key):
        if key in self.entries:
            self.entries.move_to_end(key)
            return
        if len(self.entries) == self.capacity:
            self.entries.popitem(last=False)
        self.entries[key] = None


class _ReferenceLFU:
    def __init__(self, capacity):
        self.capacity, self.count, self.last, self.clock = capacity, {}, {}, 0

    def access(self, key):
        self.clock += 1
        if key not in self.count and len(self.count) == self.capacity:
            victim = min(self.count, key=lambda k: (self.count[k], self.last[k]))
            del self.count[victim], self.last[victim]
        self.count[key] = self.count.get(key, 0) + 1
        self.last[key] = self.clock

    @property
    def entries(self):
        return self.count


@pytest.mark.parametrize("policy, reference", [("lru", _ReferenceLRU), ("lfu", _ReferenceLFU)])
def test_policy_matches_reference_on_single_id_accesses(policy, reference):
    rng = np.random.default_rng(1)
    _, cache, source = _source(policy, capacity=8)
    expected = reference(8)
    for key in rng.zipf(1.3, size=600) % 40:
        _step(source, [int(key)])
        expected.access(int(key))
        assert cached_ids(cache) == set(expected.entries)
    assert cache.stats.evictions > 0 and 0 < cache.stats.hit_rate < 1


def test_batch_rows_are_pinned_and_overflow_passes_through():
    client, cache, source = _source("lru", capacity=4)
    _step(source, [1, 2, 3])
    rows = _step(source, [1, 2, 3, 10, 11, 12])  # 3 hits pinned, 1 free slot, 2 pass through
    assert cached_ids(cache) == {1, 2, 3, 10}
    expected = client.pull_many({"t": torch.tensor([1, 2, 3, 10, 11, 12])})["t"][0]
    torch.testing.assert_close(rows, expected)


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_write_back_loses_no_gradient(policy):
    rng = np.random.default_rng(2)
    client, cache, source = _source(policy, capacity=5, push_bound=3, pull_bound=2)
    computed = collections.defaultdict(lambda: np.zeros(DIM))
    for _ in range(200):
        ids = sorted(set((rng.zipf(1.2, size=4) % 30).tolist()))
        grads = torch.from_numpy(rng.standard_normal((len(ids), DIM)).astype(np.float32))
        _step(source, ids, grads)
        for i, g in zip(ids, grads.numpy()):
            computed[i] += g
    source.flush()
    pushed = collections.defaultdict(lambda: np.zeros(DIM))
    for _, ids, grads in client.pushed:
        for i, g in zip(ids.tolist(), grads.numpy()):
            pushed[i] += g
    assert cache.stats.evictions > 0
    assert set(pushed) == set(computed)
    for i in computed:
        np.testing.assert_allclose(pushed[i], computed[i], rtol=1e-5, atol=1e-5)


def test_bounds_zero_always_reads_the_shards_value():
    # A local step size unlike the shard's: only refreshing from the shard gives its values.
    client, _, source = _source("lru", capacity=16, local_lr=0.0)
    for step in range(20):
        ids = [step % 3, 5, 7]
        rows = _step(source, ids, torch.full((3, DIM), 0.5))
        expected_rows = [client.rows[("t", i)] for i in sorted(set(ids))]
        # rows were read before this step's push: compare with what the shard held then
        assert torch.allclose(rows, torch.stack(expected_rows) + 0.1 * 0.5)


def test_pull_bound_limits_version_lag_and_push_bound_batches_pushes():
    client, cache, source = _source("lru", capacity=16, push_bound=4, pull_bound=2)
    for _ in range(12):
        _step(source, [1], torch.ones(1, DIM))
    pushes = [p for p in client.pushed if p[0] == "t"]
    assert len(pushes) == 3  # every 4th local update
    other_writer = torch.ones(1, DIM)
    for _ in range(3):  # another trainer's pushes move the shard ahead
        client.push_many({"t": (torch.tensor([1]), other_writer)})
    _step(source, [1])
    assert cache.stats.refreshes >= 1 and cache.stats.max_version_lag >= 3


def test_static_policy_caches_only_the_hot_set():
    _, cache, source = _source("static", capacity=3, hot=torch.tensor([2, 4]))
    source.warm()
    assert cached_ids(cache) == {2, 4}
    _step(source, [2, 4, 9])
    assert cached_ids(cache) == {2, 4}
    assert (cache.stats.hits, cache.stats.misses) == (2, 1)


def test_invalid_cache_configurations_are_refused():
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        HotEmbeddingCache(DIM, 0, "lru")
    with pytest.raises(ValueError, match="policy must be one of"):
        HotEmbeddingCache(DIM, 4, "fifo")
    with pytest.raises(ValueError, match="3 hot ids do not fit a capacity of 2"):
        HotEmbeddingCache(DIM, 2, "static", hot_ids=torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="required by the static policy"):
        HotEmbeddingCache(DIM, 2, "static")


def _batch(values_per_feature: list[list[int]]) -> Batch:
    sparse = [
        JaggedIds(torch.tensor(v, dtype=torch.int64), torch.arange(len(v) + 1, dtype=torch.int64))
        for v in values_per_feature
    ]
    size = len(values_per_feature[0])
    return Batch(torch.zeros(size, 13), sparse, torch.zeros(size))


def test_profiler_keeps_the_globally_most_frequent_rows_within_budget():
    batches = [_batch([[1, 1, 1, 2], [7, 7, 8, 9]]), _batch([[1, 3, 3, 3], [7, 7, 7, 9]])]
    per_row = cache_bytes_per_row(DIM)
    hot = profile_hot_ids(batches, ["a", "b"], budget_bytes=3 * per_row, per_row=per_row)
    assert hot["a"].tolist() == [1, 3] and hot["b"].tolist() == [7]
    everything = profile_hot_ids(
        batches, ["a", "b"], budget_bytes=10**9, per_row=per_row
    )  # clamped to ids seen
    assert everything["a"].tolist() == [1, 2, 3] and everything["b"].tolist() == [7, 8, 9]
    with pytest.raises(ValueError, match=f"holds no row \\({per_row} bytes each\\)"):
        profile_hot_ids(batches, ["a", "b"], budget_bytes=10, per_row=per_row)


class _OrderedFake(FakePSClient):
    """Records the order of pulls and pushes, as ("pull"|"push", ids)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.events: list[tuple[str, set[int]]] = []

    def pull_stale_many(self, requests):
        for _, ids, _, _ in requests:
            self.events.append(("pull", set(ids.tolist())))
        return super().pull_stale_many(requests)

    def push_many(self, updates):
        for ids, _ in updates.values():
            self.events.append(("push", set(ids.tolist())))
        super().push_many(updates)


def _run_steps(source: CachedRowSource, batches: list[list[int]], overlap: bool):
    """Rows served per step, driving the source as train() does (prefetch before the push)."""
    served = []
    requests = [{"t": torch.tensor(sorted(set(b)), dtype=torch.int64)} for b in batches]
    for index, request in enumerate(requests):
        rows = source.rows(request)["t"]
        if overlap and index + 1 < len(requests):
            source.prefetch(requests[index + 1])
        grads = torch.sin(rows * 3 + index)  # depends on the rows read: stale reads diverge
        source.apply_gradients({"t": (request["t"], grads)})
        served.append(rows)
    source.flush()
    return served


@pytest.mark.parametrize(
    "policy, capacity, pull_bound, push_bound",
    [("lru", 6, 0, 0), ("lfu", 6, 0, 0), ("static", 4, 0, 0), ("lru", 6, 1, 2)],
)
def test_overlapped_cache_serves_what_the_serial_one_does(policy, capacity, pull_bound, push_bound):
    rng = np.random.default_rng(7)
    batches = [list(rng.zipf(1.4, size=8) % 14) for _ in range(40)]  # collisions and evictions
    hot = torch.tensor([0, 1, 2, 3]) if policy == "static" else None
    results, clients = [], []
    for overlap in (False, True):
        client = FakePSClient(DIM)
        cache = HotEmbeddingCache(
            DIM, capacity, policy, pull_bound, push_bound, local_lr=0.1, hot_ids=hot
        )
        source = CachedRowSource(client, {"t": cache}, overlap=overlap)
        if policy == "static":
            source.warm()
        results.append(_run_steps(source, batches, overlap))
        clients.append(client)
        source.close()
    for serial, overlapped in zip(*results):
        torch.testing.assert_close(overlapped, serial, rtol=0, atol=0)
    assert clients[0].rows.keys() == clients[1].rows.keys()
    for key, row in clients[0].rows.items():
        torch.testing.assert_close(clients[1].rows[key], row, rtol=0, atol=0)


def test_overlapped_checks_ride_behind_the_push_and_other_misses_go_first():
    client = _OrderedFake(DIM)
    cache = HotEmbeddingCache(DIM, 8, "lru")
    source = CachedRowSource(client, {"t": cache}, overlap=True)
    first, second = torch.tensor([1, 2]), torch.tensor([2, 5])
    source.rows({"t": first})
    source.prefetch({"t": second})  # 2 is cached (a check); 5 is a miss nobody pushes
    source.apply_gradients({"t": (first, torch.ones(2, DIM))})
    source.rows({"t": second})
    assert client.events == [
        ("pull", {1, 2}),  # step 0's misses
        ("pull", {5}),  # step 1's miss, pulled while step 0 computes
        ("push", {1, 2}),  # step 0's push
        ("pull", {2}),  # step 1's freshness check, behind the push it must see
    ]
    source.close()
