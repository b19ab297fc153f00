"""Row-wise optimizers: SGD, Adagrad, row-wise Adagrad and Adam (rules in the .proto).

Each row's optimizer state lives next to it, ``state_width(kind, dim)`` float32
values per row, so every storage tier keeps weights and slots together.
:func:`fused_row_update` steps rows in place inside a table's storage by slot
(one native pass, no gathered copies); :func:`apply_rows` is the pure-torch
definition on gathered rows that the fallback and the tests use.
"""

from __future__ import annotations

import enum
from typing import Protocol

import torch
from ember.kernels.loader import native_backend_for

SGD, ADAGRAD, ROWWISE_ADAGRAD, ADAM = 1, 2, 3, 4  # the wire enum numbers


class RowOptimizer(Protocol):
    """An optimizer and its hyper-parameters (``ember.ps_server.wire.table_spec.OptimizerSpec``)."""

    kind: int | enum.Enum
    lr: float
    eps: float
    beta1: float
    beta2: float
    weight_decay: float


def kind_code(kind: int | enum.Enum) -> int:
    """The optimizer's number (an enum's value, or the int itself)."""
    code = int(kind.value if isinstance(kind, enum.Enum) else kind)
    if code not in (SGD, ADAGRAD, ROWWISE_ADAGRAD, ADAM):
        raise ValueError(f"unknown optimizer kind {kind!r}")
    return code


def state_width(kind: int | enum.Enum, dim: int) -> int:
    """Number of float32 optimizer-state values stored per row."""
    return {SGD: 0, ADAGRAD: dim, ROWWISE_ADAGRAD: 1, ADAM: 2 * dim}[kind_code(kind)]


def fused_row_update(
    spec: RowOptimizer,
    weights: torch.Tensor,
    state: torch.Tensor,
    versions: torch.Tensor,
    slots: torch.Tensor,
    grads: torch.Tensor,
) -> None:
    """Step the rows ``slots`` of a table in place: bump their versions, then update.

    Args:
        spec: optimizer and hyper-parameters.
        weights: float32 [rows, dim] table storage.
        state: float32 [rows, state_width] optimizer slots.
        versions: int64 [rows]; Adam's step t of a row is its version after the bump.
        slots: int64 [n] distinct rows to step.
        grads: float32 [n, dim] summed gradient of each.

    Raises:
        ValueError: dtypes, shapes or devices that do not fit together.
        RuntimeError / IndexError: a slot out of range (nothing is changed).
    """
    code = kind_code(spec.kind)
    check_row_update(code, weights, state, versions, slots, grads)
    if native_backend_for(weights):
        torch.ops.ember.fused_row_update(
            weights, state, versions, slots, grads, code,
            spec.lr, spec.eps, spec.beta1, spec.beta2, spec.weight_decay,
        )  # fmt: skip
        return
    if len(slots) and (int(slots.min()) < 0 or int(slots.max()) >= len(weights)):
        raise IndexError(f"slots out of range [0, {len(weights)})")
    rows_w, rows_s = weights[slots], state[slots]
    steps = versions[slots] + 1
    apply_rows(spec, rows_w, rows_s, grads, steps)
    weights[slots], state[slots], versions[slots] = rows_w, rows_s, steps


def apply_rows(
    spec: RowOptimizer,
    weights: torch.Tensor,
    state: torch.Tensor,
    grads: torch.Tensor,
    steps: torch.Tensor,
) -> None:
    """Apply one optimizer step to each of a batch of gathered rows, in place.

    Args:
        spec: optimizer and hyper-parameters.
        weights: float32 [n, dim] rows, updated in place.
        state: float32 [n, state_width] slots, updated in place.
        grads: float32 [n, dim] summed gradient of each row.
        steps: int64 [n] per-row update count after this update (Adam's t).
    """
    code = kind_code(spec.kind)
    if spec.weight_decay:
        grads = grads + spec.weight_decay * weights
    if code == SGD:
        weights.sub_(spec.lr * grads)
    elif code == ADAGRAD:
        state.addcmul_(grads, grads)
        weights.sub_(spec.lr * grads / (state.sqrt() + spec.eps))
    elif code == ROWWISE_ADAGRAD:
        state.add_(grads.square().mean(dim=1, keepdim=True))
        weights.sub_(spec.lr * grads / (state.sqrt() + spec.eps))
    else:
        _adam(spec, weights, state, grads, steps)


def _adam(
    spec: RowOptimizer,
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


def check_row_update(
    code: int,
    weights: torch.Tensor,
    state: torch.Tensor,
    versions: torch.Tensor,
    slots: torch.Tensor,
    grads: torch.Tensor,
) -> None:
    """Raise ValueError unless the arguments of a row update (optimizer ``code``) fit
    together: dtypes, shapes, contiguity and one device."""
    if not (weights.dtype == state.dtype == grads.dtype == torch.float32):
        raise ValueError("weights, state and grads must be float32")
    if versions.dtype != torch.int64 or slots.dtype != torch.int64:
        raise ValueError("versions and slots must be int64")
    if weights.dim() != 2 or grads.dim() != 2 or slots.dim() != 1:
        raise ValueError("weights and grads must be 2-D, slots 1-D")
    rows, dim = weights.shape
    width = state_width(code, dim)
    if tuple(state.shape) != (rows, width) or tuple(versions.shape) != (rows,):
        raise ValueError(
            f"state must be [{rows}, {width}] and versions [{rows}], "
            f"got {tuple(state.shape)} and {tuple(versions.shape)}"
        )
    if tuple(grads.shape) != (len(slots), dim):
        raise ValueError(f"grads must be [{len(slots)}, {dim}], got {tuple(grads.shape)}")
    tensors = (weights, state, versions, slots, grads)
    if not all(t.is_contiguous() for t in tensors):
        raise ValueError("weights, state, versions, slots and grads must be contiguous")
    if len({t.device for t in tensors}) != 1:
        raise ValueError("weights, state, versions, slots and grads must share a device")
