"""Float64 reference implementations that the tests compare Ember against."""

from __future__ import annotations

import numpy as np
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec


class ReferenceRow:
    """One embedding row and its optimizer state, updated in float64."""

    def __init__(self, weights: np.ndarray, spec: OptimizerSpec) -> None:
        self.w = weights.astype(np.float64).copy()
        self.spec = spec
        self.steps = 0
        dim = len(self.w)
        self.sum_sq = np.zeros(dim)  # adagrad
        self.row_sum_sq = 0.0  # rowwise adagrad
        self.m = np.zeros(dim)
        self.v = np.zeros(dim)

    def apply(self, grad: np.ndarray) -> None:
        spec = self.spec
        g = grad.astype(np.float64) + spec.weight_decay * self.w
        self.steps += 1
        if spec.kind is OptimizerKind.SGD:
            self.w -= spec.lr * g
        elif spec.kind is OptimizerKind.ADAGRAD:
            self.sum_sq += g * g
            self.w -= spec.lr * g / (np.sqrt(self.sum_sq) + spec.eps)
        elif spec.kind is OptimizerKind.ROWWISE_ADAGRAD:
            self.row_sum_sq += float(np.mean(g * g))
            self.w -= spec.lr * g / (np.sqrt(self.row_sum_sq) + spec.eps)
        elif spec.kind is OptimizerKind.ADAM:
            b1, b2, t = spec.beta1, spec.beta2, self.steps
            self.m = b1 * self.m + (1 - b1) * g
            self.v = b2 * self.v + (1 - b2) * g * g
            m_hat = self.m / (1 - b1**t)
            v_hat = self.v / (1 - b2**t)
            self.w -= spec.lr * m_hat / (np.sqrt(v_hat) + spec.eps)
        else:
            raise AssertionError(spec.kind)


OPTIMIZERS = [
    OptimizerSpec(OptimizerKind.SGD, lr=0.1, weight_decay=0.01),
    OptimizerSpec(OptimizerKind.ADAGRAD, lr=0.05, eps=1e-6),
    OptimizerSpec(OptimizerKind.ROWWISE_ADAGRAD, lr=0.05, eps=1e-6, weight_decay=0.001),
    OptimizerSpec(OptimizerKind.ADAM, lr=0.01, eps=1e-7, beta1=0.8, beta2=0.95),
]
