import numpy as np
import pytest
import torch
from ember.kernels.optim import apply_rows, fused_row_update, state_width
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec

from tests.support.reference import OPTIMIZERS, ReferenceRow

DECAYING = [OptimizerSpec(spec.kind, lr=spec.lr, weight_decay=0.01) for spec in OPTIMIZERS]


@pytest.mark.parametrize(
    "spec", OPTIMIZERS + DECAYING, ids=lambda s: f"{s.kind.name.lower()}-wd{s.weight_decay}"
)
def test_fused_update_matches_float64_reference(backend, spec):
    rng = np.random.default_rng(3)
    rows, dim = 50, 8
    start = rng.standard_normal((rows, dim)).astype(np.float32)
    references = [ReferenceRow(start[r], spec) for r in range(rows)]
    weights = torch.from_numpy(start.copy())
    state = torch.zeros(rows, state_width(spec.kind, dim))
    versions = torch.zeros(rows, dtype=torch.int64)
    for _ in range(20):
        touched = rng.choice(rows, size=17, replace=False)  # rows step at different rates
        grads = rng.standard_normal((17, dim)).astype(np.float32)
        fused_row_update(
            spec, weights, state, versions, torch.from_numpy(touched), torch.from_numpy(grads)
        )
        for row, grad in zip(touched, grads):
            references[row].apply(grad)
    np.testing.assert_allclose(
        weights.numpy(), np.stack([r.w for r in references]), rtol=1e-4, atol=1e-5
    )
    assert versions.tolist() == [r.steps for r in references]
    assert not np.allclose(weights.numpy(), start)  # the rows really moved


@pytest.mark.parametrize(
    "spec", OPTIMIZERS + DECAYING, ids=lambda s: f"{s.kind.name.lower()}-wd{s.weight_decay}"
)
def test_native_fused_update_agrees_with_torch_rows_to_rounding(spec):
    from tests.support.native import require_native

    require_native()
    rows, dim, count = 100_000, 64, 60_000
    weights = torch.randn(rows, dim)
    state = torch.rand(rows, state_width(spec.kind, dim))
    versions = torch.randint(0, 50, (rows,))
    slots = torch.randperm(rows)[:count]
    grads = torch.randn(count, dim)
    expected_w, expected_s, steps = weights[slots], state[slots], versions[slots] + 1
    apply_rows(spec, expected_w, expected_s, grads, steps)
    fused_row_update(spec, weights, state, versions, slots, grads)
    torch.testing.assert_close(weights[slots], expected_w, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state[slots], expected_s, rtol=1e-5, atol=1e-6)
    assert torch.equal(versions[slots], steps)


def test_fused_update_touches_only_its_slots(backend):
    spec = OptimizerSpec(OptimizerKind.ADAM, lr=0.1)
    weights, state = torch.randn(10, 4), torch.rand(10, 8)
    versions = torch.zeros(10, dtype=torch.int64)
    before = weights.clone(), state.clone()
    fused_row_update(spec, weights, state, versions, torch.tensor([2, 7]), torch.randn(2, 4))
    untouched = [i for i in range(10) if i not in (2, 7)]
    assert torch.equal(weights[untouched], before[0][untouched])
    assert torch.equal(state[untouched], before[1][untouched])
    assert versions.tolist() == [0, 0, 1, 0, 0, 0, 0, 1, 0, 0]


@pytest.mark.parametrize(
    "change, match",
    [
        ({"slots": torch.tensor([0, 10])}, "out of range"),
        ({"slots": torch.tensor([-1, 0])}, "out of range"),
        ({"grads": torch.randn(2, 5)}, "grads must be"),
        ({"state": torch.zeros(10, 3)}, "state must be"),
        ({"weights": torch.randn(10, 4, dtype=torch.float64)}, "float32"),
        ({"slots": torch.tensor([0.0, 1.0])}, "int64"),
    ],
)
def test_bad_update_raises_and_changes_nothing(backend, change, match):
    spec = OptimizerSpec(OptimizerKind.ADAGRAD, lr=0.1)
    args = {
        "weights": torch.randn(10, 4),
        "state": torch.zeros(10, 4),
        "versions": torch.zeros(10, dtype=torch.int64),
        "slots": torch.tensor([0, 1]),
        "grads": torch.randn(2, 4),
    } | change
    before = {name: t.clone() for name, t in args.items()}
    with pytest.raises((ValueError, RuntimeError, IndexError), match=match):
        fused_row_update(spec, **args)
    assert all(torch.equal(args[name], before[name]) for name in args)


def test_state_width_per_optimizer():
    widths = {spec.kind.name: state_width(spec.kind, 16) for spec in OPTIMIZERS}
    assert widths == {"SGD": 0, "ADAGRAD": 16, "ROWWISE_ADAGRAD": 1, "ADAM": 32}
