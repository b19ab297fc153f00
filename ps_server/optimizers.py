"""Server-side row-wise optimizers (update rules documented in the .proto).

Each optimizer updates a batch of distinct rows in place given their summed
gradients. Its state lives next to the row, ``state_width(kind, dim)`` float32
values per row, so every storage tier keeps weights and slots together.
"""

from __future__ import annotations

import torch
from ember.ps_server.table_spec import OptimizerKind, OptimizerSpec


def state_width(kind: OptimizerKind, dim: int) -> int:
    """Number of float32 optimizer-state values stored per row."""
    return {
        OptimizerKind.SGD: 0,
        OptimizerKind.ADAGRAD: dim,
        OptimizerKind.ROWWISE_ADAGRAD: 1,
        OptimizerKind.ADAM: 2 * dim,
    }[kind]


def apply_update(
    spec: OptimizerSpec,
    weights: torch.Tensor,
    state: torch.Tensor,
    grads: torch.Tensor,
    steps: torch.Tensor,
) -> None:
    """Apply one optimizer step to each row, in place.

    Args:
        spec: optimizer and hyper-parameters.
        weights: float32 [n, dim] rows, updated in place.
        state: float32 [n, state_width] slots, updated in place.
        grads: float32 [n, dim] summed gradient of each row.
        steps: int64 [n] per-row update count after this update (Adam's t).
    """
    if spec.weight_decay:
        grads = grads + spec.weight_decay * weights
    if spec.kind is OptimizerKind.SGD:
        weights.sub_(spec.lr * grads)
    elif spec.kind is OptimizerKind.ADAGRAD:
        state.addcmul_(grads, grads)
        weights.sub_(spec.lr * grads / (state.sqrt() + spec.eps))
    elif spec.kind is OptimizerKind.ROWWISE_ADAGRAD:
        state.add_(grads.square().mean(dim=1, keepdim=True))
        weights.sub_(spec.lr * grads / (state.sqrt() + spec.eps))
    elif spec.kind is OptimizerKind.ADAM:
        _adam(spec, weights, state, grads, steps)
    else:  # pragma: no cover - TableSpec.validate rejects other kinds
        raise ValueError(f"unknown optimizer {spec.kind}")


def _adam(
    spec: OptimizerSpec,
    weights: torch.Tensor,
    state: torch.Tensor,
    grads: torch.Tensor,
    steps: torch.Tensor,
) -> None:
    dim = weights.shape[1]
    m, v = state[:, :dim], state[:, dim:]
    m.mul_(spec.beta1).add_(grads, alpha=1.0 - spec.beta1)
    v.mul_(spec.beta2).addcmul_(grads, grads, value=1.0 - spec.beta2)
    t = steps.to(torch.float64).unsqueeze(1)
    bias1 = (1.0 - torch.pow(spec.beta1, t)).to(torch.float32)
    bias2 = (1.0 - torch.pow(spec.beta2, t)).to(torch.float32)
    weights.sub_(spec.lr * (m / bias1) / ((v / bias2).sqrt() + spec.eps))
