import numpy as np
import pytest
from ember.ps_server.id_index import IdIndex
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.native import require_native


@pytest.fixture(params=["native", "reference"])
def backend(request) -> bool:
    if request.param == "native":
        require_native()
    return request.param == "native"


def test_insert_churn_matches_dict_reference(backend):
    rng = np.random.default_rng(7)
    index, reference = IdIndex(capacity=16, native=backend), {}
    next_slot = 0
    for _ in range(200):  # many growth steps, batches with fresh and known ids
        candidates = np.unique(rng.integers(0, 2**62, size=rng.integers(1, 3000)))
        fresh = np.array([i for i in candidates.tolist() if i not in reference], dtype=np.int64)
        slots = np.arange(next_slot, next_slot + len(fresh))
        index.insert(fresh, slots)
        reference.update(zip(fresh.tolist(), slots.tolist()))
        next_slot += len(fresh)
        probe = np.concatenate([candidates, rng.integers(0, 2**62, size=100)])
        expected = [reference.get(i, -1) for i in probe.tolist()]
        assert index.find(probe).tolist() == expected
    assert len(index) == len(reference)
    ids, slots = index.items()
    assert dict(zip(ids.tolist(), slots.tolist())) == reference


def test_colliding_ids_all_found(backend):
    # Ids that share home buckets in a tiny table exercise the probe chains.
    index = IdIndex(capacity=16, native=backend)
    ids = np.arange(0, 10_000, dtype=np.int64) * 1024
    index.insert(ids, np.arange(len(ids)))
    assert index.find(ids[::-1]).tolist() == list(range(len(ids)))[::-1]
    assert (index.find(ids + 1) == -1).all()


def test_extreme_ids(backend):
    index = IdIndex(native=backend)
    ids = np.array([0, 2**63 - 1, 1], dtype=np.int64)
    index.insert(ids, np.array([10, 20, 30]))
    assert index.find(np.array([2**63 - 1, 0, 1, 5], dtype=np.int64)).tolist() == [20, 10, 30, -1]


@pytest.mark.parametrize("native", [True, False], ids=["native", "reference"])
@settings(max_examples=40, deadline=None)
@given(batches=st.lists(st.lists(st.integers(0, 2**63 - 1), max_size=50), max_size=20))
def test_batches_of_inserts_match_dict(native, batches):
    if native:
        require_native()
    index, reference = IdIndex(capacity=4, native=native), {}
    for batch in batches:
        fresh = list(dict.fromkeys(i for i in batch if i not in reference))
        index.insert(
            np.array(fresh, dtype=np.int64), np.arange(len(reference), len(reference) + len(fresh))
        )
        reference.update({i: len(reference) + k for k, i in enumerate(fresh)})
    probe = [i for batch in batches for i in batch] + [12345]
    assert index.find(np.array(probe, dtype=np.int64)).tolist() == [
        reference.get(i, -1) for i in probe
    ]


def test_index_bytes_stay_within_load_factor():
    index = IdIndex()
    index.insert(np.arange(100_000, dtype=np.int64), np.arange(100_000))
    buckets = index.nbytes // 16
    assert 100_000 / buckets <= IdIndex.MAX_LOAD
    assert 100_000 / buckets > IdIndex.MAX_LOAD / 2


def test_native_and_reference_share_one_layout():
    require_native()
    rng = np.random.default_rng(1)
    ids = np.unique(rng.integers(0, 2**40, size=50_000))
    written = IdIndex(capacity=16, native=True)
    written.insert(ids, np.arange(len(ids)))
    reader = IdIndex(capacity=16, native=False)
    reader._keys, reader._slots = written._keys, written._slots  # same buckets, other prober
    probe = np.concatenate([ids[::-1], rng.integers(2**41, 2**42, size=1000)])
    assert np.array_equal(reader.find(probe), written.find(probe))
