"""upsert_row_updates: the writes of a step's tables (or of one push) in one native pass.

Per table, the ids written for the first time get slots, enter the table's id
index and have their rows made (the table's hashed initial weights, zero state,
version 0); then every row takes one optimizer step, as
:func:`ember.kernels.optim.fused_row_update` (see ``csrc/table_update.cpp``).
Every table is checked before any is written. CPU only; a store without the
native ops makes the rows and steps them with the separate ops instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from ember.kernels.hashed_init import HashedInit
from ember.kernels.id_index import IdIndex
from ember.kernels.optim import RowOptimizer, kind_code


@dataclasses.dataclass(frozen=True)
class TableUpsert:
    """One table's part of :func:`upsert_row_updates`.

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
    """

    index: IdIndex
    rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    ids: torch.Tensor
    grads: torch.Tensor
    free_slots: torch.Tensor
    next_slot: int
    init: HashedInit
    spec: RowOptimizer


def upsert_row_updates(parts: Sequence[TableUpsert]) -> tuple[list[tuple[int, int]], bool]:
    """Step the rows of every part's distinct ids with its grads, making absent ones first,
    if every part's absent ids fit.

    Returns:
        ``(per part (ids absent, how many of them take a free slot), applied)``. Not
        applied (nothing written to any table) where some part's index or arrays lack
        room for its absent ids: the indexes have then been sized for them; grow each
        part's arrays to ``next_slot + absent - reused`` rows and call again.

    Raises:
        ValueError: two parts of one table.
        RuntimeError: arguments that do not fit together (dtypes, shapes, devices), a
            negative id, an absent id given twice, or a slot out of range (nothing
            written to any table; an index may have been resized).
    """
    if len({id(part.index) for part in parts}) != len(parts):
        raise ValueError("upsert_row_updates was given one table twice")
    ints, floats = [], []
    for part in parts:
        init, spec = part.init, part.spec
        ints += [part.next_slot, part.index.room, int(init.uniform), init.name_salt,
                 init.seed_key, kind_code(spec.kind)]  # fmt: skip
        floats += [init.scale, spec.lr, spec.eps, spec.beta1, spec.beta2, spec.weight_decay]
    buckets = [part.index.buckets for part in parts]
    absent, reused, applied = torch.ops.ember.upsert_row_updates(
        [keys for keys, _ in buckets], [slots for _, slots in buckets],
        *([part.rows[k] for part in parts] for k in range(3)),
        [part.ids for part in parts], [part.grads for part in parts],
        [part.free_slots for part in parts], ints, floats,
    )  # fmt: skip
    for part, count in zip(parts, absent):
        if applied:
            part.index.added(count)
        else:
            part.index.make_room(count)
    return list(zip(absent, reused)), applied
