import dataclasses

import numpy as np
import pytest
from ember.kernels.loader import reference_backend
from ember.ps_server.shard.initializers import initial_rows
from ember.ps_server.wire.table_spec import InitializerSpec, InitKind, TableSpec
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.native import require_native

IDS = np.arange(20_000, dtype=np.int64) * 7919


def test_rows_depend_only_on_seed_table_and_id():
    spec = TableSpec("t", dim=16, initializer=InitializerSpec(seed=5))
    whole = initial_rows(spec, IDS).numpy()
    pieces = np.concatenate(
        [initial_rows(spec, IDS[i : i + 999]).numpy() for i in range(0, len(IDS), 999)]
    )
    assert np.array_equal(whole, pieces)
    shuffled = np.random.default_rng(0).permutation(len(IDS))
    assert np.array_equal(initial_rows(spec, IDS[shuffled]).numpy(), whole[shuffled])


@pytest.mark.parametrize(
    "change", [{"name": "other"}, {"initializer": InitializerSpec(seed=6)}], ids=["table", "seed"]
)
def test_other_table_or_seed_gives_other_rows(change):
    spec = TableSpec("t", dim=16, initializer=InitializerSpec(seed=5))
    rows = initial_rows(spec, IDS[:100]).numpy()
    other = initial_rows(dataclasses.replace(spec, **change), IDS[:100]).numpy()
    assert abs(np.corrcoef(rows.ravel(), other.ravel())[0, 1]) < 0.05


def test_uniform_moments_and_bounds():
    rows = initial_rows(
        TableSpec("t", dim=32, initializer=InitializerSpec(InitKind.UNIFORM, 0.5)), IDS
    ).numpy()
    assert np.abs(rows).max() <= 0.5
    assert abs(rows.mean()) < 0.005
    assert rows.std() == pytest.approx(0.5 / np.sqrt(3), rel=0.01)
    columns = rows.T
    assert np.abs(np.corrcoef(columns[:8])[np.triu_indices(8, 1)]).max() < 0.05


def test_normal_moments():
    rows = initial_rows(
        TableSpec("t", dim=32, initializer=InitializerSpec(InitKind.NORMAL, 2.0)), IDS
    ).numpy()
    assert abs(rows.mean()) < 0.02
    assert rows.std() == pytest.approx(2.0, rel=0.01)
    kurtosis = np.mean((rows / rows.std()) ** 4)
    assert kurtosis == pytest.approx(3.0, abs=0.1)


def test_zeros():
    rows = initial_rows(
        TableSpec("t", dim=4, initializer=InitializerSpec(InitKind.ZEROS)), IDS[:10]
    )
    assert rows.shape == (10, 4) and not rows.any()


@settings(max_examples=60, deadline=None)
@given(
    ids=st.lists(st.integers(0, 2**63 - 1), max_size=200),
    dim=st.integers(1, 40),
    scale=st.floats(1e-6, 1e3),
    seed=st.integers(0, 2**64 - 1),
    name=st.text(min_size=1, max_size=8),
)
def test_native_uniform_rows_are_the_references_bit_for_bit(ids, dim, scale, seed, name):
    """A row's initial value is persistent (a restore, another shard count, a re-pull must
    see the same): the native op may not differ from the reference in a single bit."""
    require_native()
    spec = TableSpec(name, dim=dim, initializer=InitializerSpec(InitKind.UNIFORM, scale, seed))
    array = np.array(ids, dtype=np.int64)
    native = initial_rows(spec, array).numpy()
    with reference_backend():
        reference = initial_rows(spec, array).numpy()
    assert native.dtype == reference.dtype == np.float32
    assert np.array_equal(native.view(np.uint32), reference.view(np.uint32))


def test_initial_rows_are_pinned():
    """Pinned values: a change to either backend's function fails here."""
    spec = TableSpec("user", dim=3, initializer=InitializerSpec(InitKind.UNIFORM, 0.5, 7))
    rows = initial_rows(spec, np.array([0, 12345, 2**62], dtype=np.int64)).numpy()
    assert rows.view(np.uint32).tolist() == [
        [3197699991, 3204285151, 1050683431],
        [1028651368, 3199803611, 3199621455],
        [3200614061, 3189036162, 3189402758],
    ]
