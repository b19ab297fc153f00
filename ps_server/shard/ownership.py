"""Which ids a shard owns: every read and write is checked against the routing first."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from ember.ps_server.errors import NotOwnedError
from ember.ps_server.routing import shard_of_tables


def check_owned(
    shard: int, num_shards: int, tables: Sequence[str], ids: Sequence[np.ndarray]
) -> None:
    """Refuse ids that shard ``shard`` of ``num_shards`` does not own; ``ids[t]`` are ids of
    ``tables[t]``. Every table's ids are routed in one pass.

    Raises:
        NotOwnedError: naming the first foreign id's table, id and owner.
    """
    if num_shards == 1:
        return
    ends = np.cumsum([len(array) for array in ids], dtype=np.int64)
    if not len(ends) or not ends[-1]:
        return
    owners = shard_of_tables(tables, np.concatenate(ids), ends, num_shards)
    foreign = np.flatnonzero(owners != shard)
    if not len(foreign):
        return
    first = int(foreign[0])
    t = int(np.searchsorted(ends, first, side="right"))
    start = int(ends[t]) - len(ids[t])
    count = int(np.count_nonzero(owners[start : ends[t]] != shard))
    raise NotOwnedError(
        f"{count} of {len(ids[t])} ids of table {tables[t]!r} belong to other shards (id "
        f"{int(ids[t][first - start])} belongs to shard {int(owners[first])}, this is shard "
        f"{shard} of {num_shards}); check the client's endpoint list"
    )
