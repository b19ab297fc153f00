"""A table's initial rows in the form the native ops make them themselves (HashedInit),
and those rows written where a joined gather found ids absent (initial_rows_at)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from ember.kernels.loader import native_backend_for


@dataclasses.dataclass(frozen=True)
class HashedInit:
    """Initial weights the native op makes itself: hashed-uniform in ``[-scale, scale)``
    keyed by the table's name salt and the seed's key (``ember.ps_server.shard.initializers``'
    rule), or zeros where not ``uniform``. The salt and key are signed int64 (the ops'
    ``int``)."""

    uniform: bool
    name_salt: int = 0
    seed_key: int = 0
    scale: float = 0.0


ZEROS = HashedInit(uniform=False)

# initial_rows_at's row kinds (csrc/init.cpp's InitialRow).
_ZERO_ROW, _UNIFORM_ROW = 1, 2


def initial_rows_at(
    ids: Sequence[torch.Tensor],
    positions: Sequence[torch.Tensor],
    offsets: Sequence[int],
    row_bytes: Sequence[int],
    inits: Sequence[HashedInit],
    out: torch.Tensor,
) -> None:
    """Write the initial rows of ``ids[k][positions[k]]`` into the bytes of the flat uint8
    ``out``, whatever their alignment: the row of position ``p`` of table ``k`` at byte
    ``offsets[k] + p * row_bytes[k]``, made as ``inits[k]`` says (zero bytes, as absent
    versions and optimizer state read too, or hashed-uniform float32 values). Native CPU
    ops only: one call for every table, e.g. after a joined gather's locks are released
    (the rows are a pure function of the table and the id).

    Raises:
        RuntimeError: the native ops do not serve here, or arguments that do not fit
            together (a position outside its ids, rows past the end of ``out``); nothing is
            then written.
    """
    if not native_backend_for(out):
        raise RuntimeError("initial_rows_at needs Ember's native CPU ops, which do not serve here")
    kinds = [_UNIFORM_ROW if init.uniform else _ZERO_ROW for init in inits]
    torch.ops.ember.initial_rows_at(
        list(ids), list(positions), offsets, row_bytes, kinds,
        [init.name_salt for init in inits], [init.seed_key for init in inits],
        [init.scale for init in inits], out,
    )  # fmt: skip
