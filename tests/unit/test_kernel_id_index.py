import numpy as np
import pytest
import torch
from ember.kernels.hash_map import EMPTY, hash_erase, hash_find, hash_gather_rows, hash_insert
from ember.kernels.id_index import IdIndex
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.native import use_backend

INT64_MAX = 2**63 - 1


def ids_of(values) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int64)


def test_insert_growth_matches_dict_reference(backend):
    rng = np.random.default_rng(7)
    index, reference = IdIndex(capacity=16), {}
    for _ in range(100):  # many growth steps, batches with fresh and known ids
        candidates = np.unique(rng.integers(0, 2**62, size=rng.integers(1, 3000)))
        fresh = [i for i in candidates.tolist() if i not in reference]
        slots = torch.arange(len(reference), len(reference) + len(fresh))
        index.insert(ids_of(fresh), slots)
        reference.update(zip(fresh, slots.tolist()))
        probe = np.concatenate([candidates, rng.integers(0, 2**62, size=100)])
        assert index.find(torch.from_numpy(probe)).tolist() == [
            reference.get(i, -1) for i in probe.tolist()
        ]
    assert len(index) == len(reference)
    ids, slots = index.items()
    assert dict(zip(ids.tolist(), slots.tolist())) == reference


def test_insert_erase_churn_100k_rounds_matches_dict(backend):
    # Each round erases a few live ids and inserts a few new ones: the index stays
    # small while tombstones pile up and force rehashes.
    rng = np.random.default_rng(11)
    rounds = 100_000 if backend == "native" else 5_000
    index, reference = IdIndex(capacity=64), {}
    live, next_id = [], 0
    for round_ in range(rounds):
        if live:
            doomed = [
                live.pop(rng.integers(len(live))) for _ in range(min(len(live), rng.integers(0, 4)))
            ]
            erased = index.erase(ids_of(doomed)).tolist()
            assert erased == [reference.pop(i) for i in doomed]
        fresh = list(range(next_id, next_id + int(rng.integers(0, 4))))
        next_id += len(fresh) + int(rng.integers(0, 2**20))
        index.insert(ids_of(fresh), ids_of(range(round_ * 4, round_ * 4 + len(fresh))))
        reference.update(zip(fresh, range(round_ * 4, round_ * 4 + len(fresh))))
        live.extend(fresh)
        if round_ % 997 == 0:
            known = list(reference) + [next_id + 1]
            assert index.find(ids_of(known)).tolist() == [reference.get(i, -1) for i in known]
    assert len(index) == len(reference)
    ids, slots = index.items()
    assert dict(zip(ids.tolist(), slots.tolist())) == reference
    assert index.nbytes <= 16 * 2048  # tombstones were reclaimed, not accumulated


def test_colliding_ids_all_found(backend):
    # Ids that share home buckets in a tiny table exercise the probe chains.
    index = IdIndex(capacity=16)
    ids = torch.arange(0, 10_000, dtype=torch.int64) * 1024
    index.insert(ids, torch.arange(len(ids)))
    assert index.find(ids.flip(0)).tolist() == list(range(len(ids)))[::-1]
    assert (index.find(ids + 1) == -1).all()
    index.erase(ids[::2].contiguous())
    assert index.find(ids[1::2].contiguous()).tolist() == list(range(1, len(ids), 2))
    assert (index.find(ids[::2].contiguous()) == -1).all()


def test_extreme_ids(backend):
    index = IdIndex()
    index.insert(ids_of([0, INT64_MAX, 1]), ids_of([10, 20, 30]))
    assert index.find(ids_of([INT64_MAX, 0, 1, 5])).tolist() == [20, 10, 30, -1]
    assert index.erase(ids_of([INT64_MAX, 5])).tolist() == [20, -1]
    assert index.find(ids_of([INT64_MAX, 0])).tolist() == [-1, 10]


def test_find_of_a_million_ids(backend):
    ids = torch.randperm(2_000_000)[:1_000_000] * 3
    index = IdIndex(capacity=len(ids))
    index.insert(ids, torch.arange(len(ids)))
    probe = torch.cat([ids[torch.randperm(len(ids))], ids[:10] + 1])
    expected = torch.empty_like(probe)
    expected[: len(ids)] = torch.argsort(ids)[
        torch.searchsorted(ids.sort().values, probe[: len(ids)])
    ]
    expected[len(ids) :] = -1
    assert torch.equal(index.find(probe), expected)


@pytest.mark.parametrize("name", ["native", "reference"])
@settings(max_examples=30, deadline=None)
@given(batches=st.lists(st.lists(st.integers(0, INT64_MAX), max_size=40), max_size=15))
def test_batches_of_inserts_and_erases_match_dict(name, batches):
    with pytest.MonkeyPatch.context() as monkeypatch:
        use_backend(name, monkeypatch)
        index, reference = IdIndex(capacity=4), {}
        for number, batch in enumerate(batches):
            if number % 3 == 2:  # every third batch erases instead
                present = list(dict.fromkeys(batch))
                assert index.erase(ids_of(present)).tolist() == [
                    reference.pop(i, -1) for i in present
                ]
                continue
            fresh = list(dict.fromkeys(i for i in batch if i not in reference))
            index.insert(ids_of(fresh), ids_of(range(len(reference), len(reference) + len(fresh))))
            reference.update({i: len(reference) + k for k, i in enumerate(fresh)})
        probe = [i for batch in batches for i in batch] + [12345]
        assert index.find(ids_of(probe)).tolist() == [reference.get(i, -1) for i in probe]


def test_index_bytes_stay_within_load_factor():
    index = IdIndex()
    index.insert(torch.arange(100_000), torch.arange(100_000))
    buckets = index.nbytes // 16
    assert 100_000 / buckets <= IdIndex.MAX_LOAD
    assert 100_000 / buckets > IdIndex.MAX_LOAD / 2


def test_native_and_reference_read_each_others_layout(monkeypatch):
    from tests.support.native import require_native

    require_native()
    ids = torch.unique(torch.randint(0, 2**40, (50_000,)))
    written = IdIndex(capacity=16)
    written.insert(ids, torch.arange(len(ids)))
    written.erase(ids[::3].contiguous())  # tombstones too
    probe = torch.cat([ids.flip(0), torch.randint(2**41, 2**42, (1000,))])
    native_answer = written.find(probe)
    use_backend("reference", monkeypatch)
    assert torch.equal(written.find(probe), native_answer)


def fresh_map(capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full((capacity,), EMPTY, dtype=torch.int64), torch.zeros(
        capacity, dtype=torch.int64
    )


def test_a_full_map_refuses_the_insert_and_keeps_its_contents(backend):
    keys, slots = fresh_map(8)
    hash_insert(keys, slots, ids_of(range(5)), ids_of(range(5)))
    before = keys.clone(), slots.clone()
    with pytest.raises(RuntimeError, match="full"):
        hash_insert(
            keys, slots, ids_of([100, 101, 102]), ids_of([5, 6, 7])
        )  # would leave no empty bucket
    live = keys >= 0  # slots under empty buckets mean nothing
    assert torch.equal(keys, before[0]) and torch.equal(slots[live], before[1][live])
    assert hash_find(keys, slots, ids_of(range(6))).tolist() == [0, 1, 2, 3, 4, -1]


@pytest.mark.parametrize(
    "ids, match",
    [([3, 1], "already in the map"), ([7, 7], "twice"), ([-5], ">= 0")],
)
def test_bad_inserts_raise_and_change_nothing(backend, ids, match):
    keys, slots = fresh_map(16)
    hash_insert(keys, slots, ids_of([1]), ids_of([0]))
    before = keys.clone()
    with pytest.raises(RuntimeError, match=match):
        hash_insert(keys, slots, ids_of(ids), ids_of(range(len(ids))))
    assert torch.equal(keys, before)


@pytest.mark.parametrize(
    "keys, slots, ids, match",
    [
        (torch.full((12,), -1), torch.zeros(12, dtype=torch.int64), ids_of([1]), "power-of-two"),
        (torch.full((16,), -1), torch.zeros(16, dtype=torch.int64), torch.tensor([1.0]), "int64"),
        (
            torch.full((16,), -1),
            torch.zeros(16, dtype=torch.int64),
            torch.arange(4)[::2],
            "contiguous",
        ),
        (
            torch.full((16,), -1),
            torch.zeros(8, dtype=torch.int64),
            ids_of([1]),
            "power-of-two length",
        ),
    ],
)
def test_malformed_maps_and_ids_are_refused(backend, keys, slots, ids, match):
    with pytest.raises(ValueError, match=match):
        hash_find(keys, slots, ids)
    with pytest.raises(ValueError, match=match):
        hash_erase(keys, slots, ids)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gather_copies_present_rows_and_names_the_absent_ones(backend, dtype):
    rng = np.random.default_rng(3)
    held = torch.from_numpy(np.unique(rng.integers(0, 2**62, 5000)))
    index = IdIndex(capacity=16)
    slots = torch.from_numpy(rng.permutation(len(held))).to(torch.int64)
    index.insert(held, slots)
    index.erase(held[::7].contiguous())  # tombstones on the probe paths
    src = torch.randn(len(held), 5, dtype=dtype)
    probe = torch.cat([held[rng.integers(0, len(held), 3000)], torch.tensor([2**62 + 1, 7])])
    out = torch.full((len(probe), 5), -9.0, dtype=dtype)
    absent = index.gather(probe, src, out)
    found = index.find(probe)
    assert absent.tolist() == (found < 0).nonzero().squeeze(1).tolist()
    assert len(absent) >= 2 + 3000 // 8  # the erased ids and the two never inserted
    present = found >= 0
    assert torch.equal(out[present], src[found[present]])
    assert bool((out[~present] == -9.0).all())  # absent rows untouched


def test_gather_refuses_mismatched_rows(backend):
    index = IdIndex(capacity=16)
    index.insert(ids_of([1, 2]), ids_of([0, 1]))
    src = torch.zeros(2, 4)
    for out, match in ((torch.zeros(3, 4), "out must be"), (torch.zeros(2, 3), "out must be"),
                       (torch.zeros(2, 4, dtype=torch.float64), "out must be")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            index.gather(ids_of([1, 2]), src, out)


def test_gather_of_a_slot_outside_src_raises_before_writing_any_row(backend):
    index = IdIndex(capacity=64)
    index.insert(ids_of(range(40)), ids_of([*range(39), 99]))  # id 39 maps past src's 39 rows
    src = torch.randn(39, 4)
    out = torch.full((40, 4), -9.0)
    with pytest.raises(RuntimeError, match="slot 99 outside src's 39 rows"):
        index.gather(ids_of(range(40)), src, out)  # the bad id comes after 39 good ones
    assert bool((out == -9.0).all())


def test_negative_ids_are_never_found_even_where_they_equal_a_bucket_marker(backend):
    # 30 of 32 buckets erased, two empty: a probe for -2 meets tombstones (-2) and one
    # for -1 ends at an empty bucket (-1); neither marker is an id.
    keys, slots = fresh_map(32)
    hash_insert(keys, slots, ids_of(range(100, 130)), ids_of(range(30)))
    hash_erase(keys, slots, ids_of(range(100, 130)))
    hash_insert(keys, slots, ids_of([7]), ids_of([3]))
    probe = ids_of([-1, -2, 7, -(2**63)])
    assert hash_find(keys, slots, probe).tolist() == [-1, -1, 3, -1]
    src, out = torch.arange(16.0).view(4, 4), torch.full((4, 4), -9.0)
    assert hash_gather_rows(keys, slots, src, probe, out).tolist() == [0, 1, 3]
    assert out[2].tolist() == src[3].tolist() and bool((out[[0, 1, 3]] == -9.0).all())
    before = keys.clone()
    assert hash_erase(keys, slots, probe).tolist() == [-1, -1, 3, -1]
    assert torch.equal(keys[keys != before], torch.tensor([-2]))  # only 7's bucket erased


def test_native_gather_refuses_an_out_that_shares_src(backend):
    if backend != "native":
        pytest.skip("the reference gathers through a copy: sharing cannot corrupt it")
    index = IdIndex(capacity=16)
    index.insert(ids_of([1, 2]), ids_of([1, 0]))
    src = torch.randn(2, 4)
    with pytest.raises(RuntimeError, match="must not share src's storage"):
        index.gather(ids_of([1, 2]), src, src)
