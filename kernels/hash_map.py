"""Batched ops on an open-addressing hash map from non-negative int64 id to slot.

The map is two int64 tensors of a power-of-two length on one device: ``keys``
(-1 empty, -2 erased) and ``slots``. An id's home bucket is
``mix64(id ^ INDEX_SALT) & (capacity - 1)``; collisions probe linearly. Erase
leaves a tombstone that lookups step over and inserts never reuse, so native
(CPU, CUDA) and reference backends read each other's layout. Inserts refuse a
negative id, so the other ops find none (never the empty or erased marker).
Sizing and rehashing belong to the owner (:class:`ember.kernels.id_index.IdIndex`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from ember.kernels.loader import native_backend_for

EMPTY = -1
TOMBSTONE = -2
INDEX_SALT = 0x5851F42D4C957F2D  # independent of the routing hash's salts

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser over a uint64 array (wrapping arithmetic); a bijection."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MUL1
        z = (z ^ (z >> np.uint64(27))) * _MUL2
        return z ^ (z >> np.uint64(31))


def home_buckets(ids: torch.Tensor, capacity: int) -> torch.Tensor:
    """Home bucket of each id in a map of ``capacity`` buckets (on the ids' device)."""
    salted = ids.cpu().numpy().view(np.uint64) ^ np.uint64(INDEX_SALT)
    homes = (mix64(salted) & np.uint64(capacity - 1)).astype(np.int64)
    return torch.from_numpy(homes).to(ids.device)


def hash_find(keys: torch.Tensor, slots: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Slot of every id, -1 where absent (duplicates allowed)."""
    _check_map(keys, slots, ids)
    if native_backend_for(keys):
        return torch.ops.ember.hash_find(keys, slots, ids)
    buckets = _locate(keys, ids)
    return torch.where(buckets >= 0, slots[buckets.clamp(min=0)], -1)


def hash_gather_rows(
    keys: torch.Tensor, slots: torch.Tensor, src: torch.Tensor, ids: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """``out[i] = src[slot of ids[i]]`` for every id in the map (duplicates allowed);
    returns the ascending positions of the ids not in it, whose rows of ``out`` are left
    as they were. The read path of a table. ``out`` must not share ``src``'s storage.

    Raises:
        RuntimeError: the map holds a slot outside ``src`` (``out`` untouched).
    """
    _check_map(keys, slots, ids)
    if src.dim() != 2 or out.shape != (len(ids), src.shape[1]) or out.dtype != src.dtype:
        raise ValueError(
            f"out must be [{len(ids)}, row width] of src's dtype, got {tuple(out.shape)} "
            f"{out.dtype} for src {tuple(src.shape)} {src.dtype}"
        )
    if src.device.type == "cpu" and native_backend_for(keys):
        return torch.ops.ember.hash_gather_rows(keys, slots, src, ids, out)
    buckets = _locate(keys, ids)
    present = buckets >= 0
    rows = slots[buckets[present]]
    outside = (rows < 0) | (rows >= len(src))
    if bool(outside.any()):
        bad = int(rows[outside][0])
        raise RuntimeError(f"the map holds slot {bad} outside src's {len(src)} rows")
    out[present] = src[rows]
    return (~present).nonzero().squeeze(1)


def hash_gather_joined(
    maps: Sequence[tuple[torch.Tensor, torch.Tensor]],
    srcs: Sequence[torch.Tensor],
    ids: Sequence[torch.Tensor],
    offsets: Sequence[int],
    out: torch.Tensor,
) -> list[torch.Tensor]:
    """:func:`hash_gather_rows` of several maps ``(keys, slots)`` (a table's each) into the
    bytes of one flat uint8 ``out``, whatever their alignment: map k's rows of ``ids[k]``
    from ``srcs[k]`` (of any dtype, copied as host-order bytes) start at byte
    ``offsets[k]``, at or after the end of map k-1's. Native CPU ops only: one call
    instead of one per table.

    Returns:
        Each map's absent positions, ascending (their rows of ``out`` untouched; see
        :func:`~ember.kernels.hashed_init.initial_rows_at`).

    Raises:
        RuntimeError: the native ops do not serve here, or arguments that do not fit
            together (shapes, devices, storage shared with ``out``, offsets that overlap
            or pass its end) or a slot outside its ``src``; ``out`` is then untouched.
    """
    if not native_backend_for(out):
        raise RuntimeError(
            "hash_gather_joined needs Ember's native CPU ops, which do not serve here "
            "(EMBER_KERNELS=reference, a forced reference, or no build); gather each map alone"
        )
    keys, slots = [keys for keys, _ in maps], [slots for _, slots in maps]
    return torch.ops.ember.hash_gather_joined(keys, slots, list(srcs), list(ids), offsets, out)


def hash_erase(keys: torch.Tensor, slots: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Remove ids (absent ones are ignored); returns the slot each held, -1 where absent."""
    _check_map(keys, slots, ids)
    if native_backend_for(keys):
        return torch.ops.ember.hash_erase(keys, slots, ids)
    buckets = _locate(keys, ids)
    found = buckets >= 0
    erased = torch.where(found, slots[buckets.clamp(min=0)], -1)
    keys[buckets[found]] = TOMBSTONE
    return erased


def hash_insert(
    keys: torch.Tensor, slots: torch.Tensor, ids: torch.Tensor, new_slots: torch.Tensor
) -> None:
    """Map distinct, absent, non-negative ``ids[i] -> new_slots[i]``; all or nothing.

    Raises:
        RuntimeError: an id is negative, present or repeated, or the map would have
            no empty bucket left (it is full: rehash into a larger one).
    """
    _check_map(keys, slots, ids)
    if new_slots.dtype != torch.int64 or new_slots.shape != ids.shape:
        raise ValueError(f"new_slots must be int64 of shape {tuple(ids.shape)}")
    if native_backend_for(keys):
        torch.ops.ember.hash_insert(keys, slots, ids, new_slots.contiguous())
        return
    if len(ids) == 0:
        return
    if int(ids.min()) < 0:
        raise RuntimeError(f"ids must be >= 0, got {int(ids.min())}")
    if len(torch.unique(ids)) != len(ids) or bool((_locate(keys, ids) >= 0).any()):
        raise RuntimeError("an id is already in the map or twice in ids")
    if len(ids) >= int((keys == EMPTY).sum()):
        raise RuntimeError(f"hash map is full: {len(ids)} ids do not fit; rehash into a larger map")
    _place(keys, slots, ids, new_slots)


def _check_map(keys: torch.Tensor, slots: torch.Tensor, ids: torch.Tensor) -> None:
    for name, tensor in (("keys", keys), ("slots", slots), ("ids", ids)):
        if tensor.dtype != torch.int64 or tensor.dim() != 1 or not tensor.is_contiguous():
            raise ValueError(
                f"{name} must be a contiguous 1-D int64 tensor, got {tensor.dtype} {tuple(tensor.shape)}"
            )
    capacity = len(keys)
    if len(slots) != capacity or capacity == 0 or capacity & (capacity - 1):
        raise ValueError(
            f"keys and slots must have one power-of-two length, got {capacity}, {len(slots)}"
        )
    if not keys.device == slots.device == ids.device:
        raise ValueError(
            f"keys, slots and ids must share a device, got {keys.device}, {slots.device}, {ids.device}"
        )


def _locate(keys: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Bucket holding each id, or -1 (always for a negative id): every pending id advances
    one bucket per round."""
    mask = len(keys) - 1
    result = torch.full_like(ids, -1)
    pending = (ids >= 0).nonzero().squeeze(1)
    pos = home_buckets(ids[pending], len(keys))
    for _ in range(len(keys)):
        if not len(pending):
            break
        seen = keys[pos]
        hit = seen == ids[pending]
        result[pending[hit]] = pos[hit]
        go_on = ~(hit | (seen == EMPTY))
        pending, pos = pending[go_on], (pos[go_on] + 1) & mask
    return result


def _place(
    keys: torch.Tensor, slots: torch.Tensor, ids: torch.Tensor, values: torch.Tensor
) -> None:
    """Linear-probing insert of a batch; among ids reaching one empty bucket, the first wins."""
    mask = len(keys) - 1
    pending = torch.arange(len(ids), device=ids.device)
    pos = home_buckets(ids, len(keys))
    while len(pending):
        free = (keys[pos] == EMPTY).nonzero().squeeze(1)
        sorted_pos, order = torch.sort(pos[free], stable=True)
        first = torch.ones_like(sorted_pos, dtype=torch.bool)
        first[1:] = sorted_pos[1:] != sorted_pos[:-1]
        winners = free[order[first]]
        keys[pos[winners]] = ids[pending[winners]]
        slots[pos[winners]] = values[pending[winners]]
        keep = torch.ones(len(pending), dtype=torch.bool, device=ids.device)
        keep[winners] = False
        pending, pos = pending[keep], pos[keep]
        taken = keys[pos] != EMPTY  # losers re-probe their (now taken) bucket, then move on
        pos[taken] = (pos[taken] + 1) & mask
