"""Seeded byte-level mutations of valid messages, for fuzz tests bounded in count."""

from __future__ import annotations

import random


def mutated(valid: bytes, rng: random.Random) -> bytes:
    """``valid`` with 1-3 edits: a flipped bit, a cut, an inserted, deleted or replaced byte,
    or a duplicated slice (which repeats fields and breaks lengths)."""
    data = bytearray(valid)
    for _ in range(rng.randint(1, 3)):
        edit = rng.randrange(6)
        position = rng.randrange(len(data) + 1)
        if edit == 0 and data:
            data[min(position, len(data) - 1)] ^= 1 << rng.randrange(8)
        elif edit == 1:
            del data[position:]
        elif edit == 2:
            data.insert(position, rng.randrange(256))
        elif edit == 3 and data:
            del data[min(position, len(data) - 1)]
        elif edit == 4 and data:
            data[min(position, len(data) - 1)] = rng.choice([0x00, 0x7F, 0x80, 0xFF])
        elif edit == 5 and data:
            start = rng.randrange(len(data))
            data[position:position] = data[start : start + rng.randint(1, 16)]
    return bytes(data)
