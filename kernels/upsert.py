"""upsert_row_update: a push's write to a table's storage in one native pass.

The ids a push writes for the first time get slots, enter the id index and have
their rows made (the table's hashed initial weights, zero state, version 0); then
every row takes one optimizer step, as :func:`ember.kernels.optim.fused_row_update`
(see ``csrc/table_update.cpp``). CPU only; a store without the native ops makes
the rows and steps them with the separate ops instead.
"""

from __future__ import annotations

import dataclasses

import torch
from ember.kernels.id_index import IdIndex
from ember.kernels.optim import RowOptimizer, check_row_update, kind_code


@dataclasses.dataclass(frozen=True)
class HashedInit:
    """Initial weights the native op makes itself: hashed-uniform in ``[-scale, scale)``
    keyed by the table's name salt and the seed's key (``ember.ps_server.shard.initializers``'
    rule), or zeros where not ``uniform``."""

    uniform: bool
    name_salt: int = 0
    seed_key: int = 0
    scale: float = 0.0


def upsert_row_update(
    index: IdIndex,
    rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    ids: torch.Tensor,
    grads: torch.Tensor,
    free_slots: torch.Tensor,
    next_slot: int,
    init: HashedInit,
    spec: RowOptimizer,
) -> tuple[int, int, bool]:
    """Step the rows of distinct ``ids`` with ``grads``, making absent ones first, if they fit.

    Args:
        index: the table's id -> slot map.
        rows: the table's ``(weights, state, versions)`` storage.
        ids: int64 [n] distinct ids >= 0 (a held id given twice is stepped twice).
        grads: float32 [n, dim] summed gradient of each.
        free_slots: int64 slots to reuse; absent ids take its tail first, in order.
        next_slot: the first never-used slot (absent ids past the free ones take the
            slots from here on).
        init: how absent rows' weights are made.
        spec: optimizer and hyper-parameters.

    Returns:
        ``(ids absent, how many of them take a free slot, applied)``. Not applied
        (nothing written) where the index or the arrays lack room for the absent ids:
        the index has then been sized for them; grow the arrays to
        ``next_slot + absent - reused`` rows and call again.

    Raises:
        ValueError: arguments that do not fit together (dtypes, shapes, devices).
        RuntimeError: a negative id, an absent id given twice, or a slot out of range
            (nothing written; the index may have been resized).
    """
    weights, state, versions = rows
    code = kind_code(spec.kind)
    check_row_update(code, weights, state, versions, ids, grads)
    reused = 0

    def insert_and_step(keys: torch.Tensor, slots: torch.Tensor, room: int) -> tuple[int, bool]:
        nonlocal reused
        absent, reused, applied = torch.ops.ember.upsert_row_update(
            keys, slots, weights, state, versions, ids, grads, free_slots, next_slot, room,
            init.uniform, init.name_salt, init.seed_key, init.scale,
            code, spec.lr, spec.eps, spec.beta1, spec.beta2, spec.weight_decay,
        )  # fmt: skip
        return absent, applied

    absent, applied = index.insert_with(insert_and_step)
    return absent, reused, applied
