import numpy as np
import pytest
import torch
from ember.ps_server.optimizers import apply_update, state_width

from tests.support.reference import OPTIMIZERS, ReferenceRow


@pytest.mark.parametrize("spec", OPTIMIZERS, ids=lambda s: s.kind.name.lower())
def test_optimizer_matches_float64_reference(spec):
    rng = np.random.default_rng(3)
    rows, dim = 5, 8
    start = rng.standard_normal((rows, dim)).astype(np.float32)
    references = [ReferenceRow(start[r], spec) for r in range(rows)]
    weights = torch.from_numpy(start.copy())
    state = torch.zeros(rows, state_width(spec.kind, dim))
    steps = torch.zeros(rows, dtype=torch.int64)
    for _ in range(20):
        touched = np.sort(rng.choice(rows, size=3, replace=False))  # rows update at different rates
        grads = rng.standard_normal((3, dim)).astype(np.float32)
        index = torch.from_numpy(touched)
        w, s = weights[index], state[index]
        steps[index] += 1
        apply_update(spec, w, s, torch.from_numpy(grads), steps[index])
        weights[index], state[index] = w, s
        for row, grad in zip(touched, grads):
            references[row].apply(grad)
    expected = np.stack([r.w for r in references])
    np.testing.assert_allclose(weights.numpy(), expected, rtol=1e-4, atol=1e-5)
    assert not np.allclose(expected, start)  # the rows really moved


def test_state_width_per_optimizer():
    widths = {spec.kind.name: state_width(spec.kind, 16) for spec in OPTIMIZERS}
    assert widths == {"SGD": 0, "ADAGRAD": 16, "ROWWISE_ADAGRAD": 1, "ADAM": 32}
