"""Validation of user-supplied ids and gradients before anything is sent."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from ember.kernels.rows import scatter_add_rows


def as_id_array(ids: Any) -> np.ndarray:
    """A contiguous 1-D int64 numpy array of non-negative ids.

    Accepts a torch tensor, numpy array or sequence of ints.

    Raises:
        ValueError: not 1-D, not an integer type, or a negative id.
    """
    if isinstance(ids, torch.Tensor):
        if ids.dtype != torch.int64 and (
            ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool
        ):
            raise ValueError(f"ids must be an integer tensor, got dtype {ids.dtype}")
        array = (
            ids.numpy()
            if ids.device.type == "cpu" and not ids.requires_grad
            else ids.detach().cpu().numpy()
        )
    else:
        array = np.asarray(ids)
        if array.size == 0 and array.dtype == np.float64:  # [] parses as float64
            array = array.astype(np.int64)
        if not np.issubdtype(array.dtype, np.integer):
            raise ValueError(f"ids must be integers, got dtype {array.dtype}")
    if array.ndim != 1:
        raise ValueError(f"ids must be 1-D, got shape {tuple(array.shape)}")
    if array.dtype == np.uint64 and len(array) and array.max() > np.iinfo(np.int64).max:
        raise ValueError("ids must be <= 2^63-1")
    array = np.ascontiguousarray(array, dtype=np.int64)
    if len(array) and array.min() < 0:
        raise ValueError(f"ids must be >= 0, got {int(array.min())}")
    return array


def as_grad_rows(grads: Any, num_rows: int, dim: int) -> torch.Tensor:
    """A contiguous float32 CPU tensor [num_rows, dim] of finite gradients.

    Raises:
        ValueError: wrong shape or a NaN/Inf value.
    """
    tensor = grad_tensor(grads, num_rows, dim)
    check_finite(tensor, "grads")
    return tensor


def grad_tensor(grads: Any, num_rows: int, dim: int) -> torch.Tensor:
    """``grads`` as a contiguous float32 CPU tensor [num_rows, dim] (values unchecked).

    Raises:
        ValueError: wrong shape.
    """
    tensor = torch.as_tensor(grads).detach().to("cpu", torch.float32).contiguous()
    if tuple(tensor.shape) != (num_rows, dim):
        raise ValueError(f"grads must have shape ({num_rows}, {dim}), got {tuple(tensor.shape)}")
    return tensor


def check_finite(rows: torch.Tensor, what: str) -> None:
    """Refuse a float32 CPU tensor holding NaN or Inf.

    Raises:
        ValueError: "``what`` contain NaN or Inf".
    """
    values = rows.numpy()
    # A finite sum proves every value finite (a NaN or Inf would carry into it); only a sum
    # that overflowed or met one needs the check of every value.
    with np.errstate(over="ignore", invalid="ignore"):  # an overflowing sum is not an error
        finite_sum = bool(np.isfinite(values.sum()))
    if not finite_sum and not np.isfinite(values).all():
        raise ValueError(f"{what} contain NaN or Inf")


def id_tensor(ids: np.ndarray) -> torch.Tensor:
    """Ids as an int64 tensor sharing memory (copied when read-only, e.g. request bytes)."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    return torch.from_numpy(ids if ids.flags.writeable else ids.copy())


def sum_duplicates(ids: np.ndarray, grads: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
    """Ascending distinct ids and the summed gradient rows of each (summed in order of
    occurrence).

    Ids already strictly increasing (as clients send them) pass through as they are;
    distinct ids out of order are sorted with their rows.
    """
    if len(ids) < 2 or bool(np.all(ids[1:] > ids[:-1])):
        return ids, grads
    # Not stable (2-3x quicker): any ascending order gives each position its id's group, and
    # the rows are added by position, in order of occurrence.
    order = np.argsort(ids)
    ordered = ids[order]
    first = np.empty(len(ids), dtype=bool)
    first[0], first[1:] = True, ordered[1:] != ordered[:-1]
    if bool(first.all()):
        return ordered, torch.index_select(grads, 0, torch.from_numpy(order))
    inverse = np.empty(len(ids), dtype=np.int64)
    inverse[order] = np.cumsum(first) - 1
    summed = torch.zeros(int(first.sum()), grads.shape[1], dtype=grads.dtype)
    scatter_add_rows(summed, torch.from_numpy(inverse), grads.contiguous())
    return ordered[first], summed
