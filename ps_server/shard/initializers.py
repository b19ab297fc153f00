"""Deterministic row initialisation keyed on (seed, table, id).

A row's initial value is a pure function of the table spec and the id, so it
is the same on any number of shards, after a restore and on a re-pull.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from ember.kernels.hashed_init import ZEROS, HashedInit
from ember.kernels.loader import native_backend_for
from ember.ps_server.id_arrays import id_tensor
from ember.ps_server.routing import mix64, name_salt
from ember.ps_server.wire.table_spec import InitKind, TableSpec

_INV_2_24 = 1.0 / float(1 << 24)
_STREAM = np.uint64(0xD1B54A32D192ED03)


def _element_bits(spec: TableSpec, ids: np.ndarray) -> np.ndarray:
    """Independent 64-bit random words, [len(ids), dim], one per element."""
    seed = np.uint64(spec.initializer.seed)
    row_keys = mix64(mix64(ids.view(np.uint64) ^ name_salt(spec.name)) ^ mix64(seed[None])[0])
    columns = np.arange(1, spec.dim + 1, dtype=np.uint64) * _STREAM
    with np.errstate(over="ignore"):
        return mix64(row_keys[:, None] + columns[None, :])


@functools.lru_cache(maxsize=256)
def _seed_key(seed: int) -> int:
    """``mix64(seed)`` as the signed integer the native op takes."""
    return _signed(mix64(np.array([seed], dtype=np.uint64))[0])


def _signed(word: np.uint64) -> int:
    """A 64-bit word as the signed integer an op's ``int`` argument carries."""
    return int(word.view(np.int64))


def hashed_init(spec: TableSpec) -> HashedInit | None:
    """The native ops' form of ``spec``'s initializer, None where they have none (normal)."""
    init = spec.initializer
    if init.kind is InitKind.ZEROS:
        return ZEROS
    if init.kind is InitKind.UNIFORM:
        return HashedInit(True, _signed(name_salt(spec.name)), _seed_key(init.seed), init.scale)
    return None


def initial_rows(spec: TableSpec, ids: np.ndarray) -> torch.Tensor:
    """Initial float32 rows [len(ids), spec.dim] for int64 ``ids`` of table ``spec``.

    Example:
        >>> rows = initial_rows(TableSpec("t", dim=4), np.array([7], dtype=np.int64))
        >>> tuple(rows.shape)
        (1, 4)
    """
    init = spec.initializer
    if init.kind is InitKind.ZEROS or len(ids) == 0:
        return torch.zeros(len(ids), spec.dim, dtype=torch.float32)
    id_batch = id_tensor(ids)
    if init.kind is InitKind.UNIFORM and native_backend_for(id_batch):  # the same bits
        hashed = hashed_init(spec)
        return torch.ops.ember.uniform_rows(
            id_batch, hashed.name_salt, hashed.seed_key, spec.dim, hashed.scale
        )
    bits = _element_bits(spec, ids)
    u1 = ((bits >> np.uint64(40)).astype(np.float64) + 0.5) * _INV_2_24
    if init.kind is InitKind.UNIFORM:
        values = (2.0 * u1 - 1.0) * init.scale
    else:  # NORMAL, Box-Muller on two 24-bit uniforms from one word
        u2 = ((bits & np.uint64(0xFFFFFF)).astype(np.float64) + 0.5) * _INV_2_24
        values = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2) * init.scale
    return torch.from_numpy(values.astype(np.float32))
