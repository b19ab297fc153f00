"""Row arrays that grow in place: no copy while the reservation lasts, a correct doubling where
the kernel refuses one, and a store whose three arrays always share one length."""

import mmap
from pathlib import Path

import numpy as np
import pytest
import torch
from ember.ps_server.stores import memory
from ember.ps_server.stores.memory import InMemoryStore
from ember.ps_server.stores.reserved_rows import ReservedRows
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec


def test_growth_within_the_reservation_moves_nothing():
    rows = ReservedRows((4,), torch.float32, rows=8, reserve=1 << 20)
    rows.tensor[:8] = torch.arange(32, dtype=torch.float32).view(8, 4)
    address = rows.tensor.data_ptr()
    rows.ensure(500_000, used=8)
    assert rows.tensor.data_ptr() == address and rows.capacity >= 500_000
    assert torch.equal(rows.tensor[:8], torch.arange(32, dtype=torch.float32).view(8, 4))
    rows.ensure(3 << 20, used=8)  # past the reservation: a copy, values kept
    assert rows.capacity >= 3 << 20
    assert torch.equal(rows.tensor[:8], torch.arange(32, dtype=torch.float32).view(8, 4))


def _refuse_some(monkeypatch, every: int) -> None:
    """Make every ``every``-th reservation fail, as strict overcommit would."""
    real, calls = mmap.mmap, [0]

    def flaky(*args, **kwargs):
        calls[0] += 1
        if calls[0] % every == 0:
            raise OSError(12, "Cannot allocate memory")
        return real(*args, **kwargs)

    monkeypatch.setattr("ember.ps_server.stores.reserved_rows.mmap.mmap", flaky)


@pytest.mark.parametrize("every", [1, 2])
def test_a_refused_reservation_doubles_and_the_store_stays_exact(monkeypatch, every):
    _refuse_some(monkeypatch, every)
    store = InMemoryStore(dim=4, state_width=4, capacity=16)
    optimizer = OptimizerSpec(OptimizerKind.ADAGRAD, lr=0.5)
    expected = {}
    for start in range(0, 3000, 700):  # several doublings of the refused arrays
        ids = np.arange(start, start + 700, dtype=np.int64)
        grads = torch.full((700, 4), 0.25)
        store.update(ids, grads, optimizer, create=memory_rows)
        for i in ids:
            expected[int(i)] = expected.get(int(i), 0) + 1
    lengths = {len(store._weights), len(store._state), len(store._versions)}
    assert len(lengths) == 1  # the fused op indexes the three together
    ids = np.arange(0, 3500, dtype=np.int64)
    found, rows = store.fetch(ids)
    assert found.all()
    assert rows.versions.tolist() == [expected[i] for i in range(3500)]
    # Adagrad from zero rows, one step of 0.25: w = -lr * g / sqrt(g^2) = -0.5
    np.testing.assert_allclose(rows.weights.numpy(), -0.5, rtol=1e-6)


def memory_rows(ids: np.ndarray) -> memory.RowBatch:
    return memory.RowBatch(
        torch.zeros(len(ids), 4), torch.zeros(len(ids), 4), torch.zeros(len(ids), dtype=torch.int64)
    )


def _huge_pages_allowed(tensor: torch.Tensor) -> bool:
    """Whether the mapping holding ``tensor``'s first byte may use transparent huge pages."""
    address, eligible = tensor.data_ptr(), None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            low, high = (int(part, 16) for part in head.split("-"))
            inside = low <= address < high
        elif line.startswith("THPeligible:") and inside:
            eligible = line.split()[1] == "1"
    return bool(eligible)


def test_only_large_arrays_ask_for_huge_pages():
    if Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().find("[madvise]") < 0:
        pytest.skip("transparent huge pages are not in madvise mode here: nothing to ask")
    store = InMemoryStore(dim=64, state_width=0, capacity=16)
    rows = memory.RowBatch(
        torch.ones(1000, 64), torch.empty(1000, 0), torch.zeros(1000, dtype=torch.int64)
    )
    store.insert(np.arange(1000, dtype=np.int64), rows)
    assert not _huge_pages_allowed(store._weights)  # small tables keep 4 KiB pages
    big = (64 << 20) // (4 * 64) + 1
    batch = memory.RowBatch(
        torch.ones(big, 64), torch.empty(big, 0), torch.zeros(big, dtype=torch.int64)
    )
    store.insert(np.arange(1000, 1000 + big, dtype=np.int64), batch)
    assert _huge_pages_allowed(store._weights)
