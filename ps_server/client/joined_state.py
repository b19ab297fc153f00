"""Where an update's optimizer-state answers land (``UpdateRequest.read_state``).

Each shard answers, per entry it was asked, its rows' versions (int64) and
then their optimizer state (float32, the optimizer's state width per row),
back to back; they are scattered into each table's arrays in the caller's
order of its ids.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from ember.ps_server.client.joined_ids import JoinedIds
from ember.ps_server.errors import InvalidArgumentError


class JoinedState:
    """The versions and optimizer state of a routed set of rows.

    Args:
        ids: every table's ids (distinct), joined and routed.
        widths: each table's state width (floats per row), by name.
    """

    def __init__(self, ids: JoinedIds, widths: Mapping[str, int]) -> None:
        self.ids = ids
        self._widths = [widths[table] for table in ids.tables]
        self._versions = [np.zeros(n, np.int64) for n in ids.lengths.tolist()]
        self._state = [
            np.zeros((n, w), np.float32) for n, w in zip(ids.lengths.tolist(), self._widths)
        ]

    def place(self, shard: int, payload: memoryview) -> None:
        """Scatter ``shard``'s answer (its entries' versions and state, as asked).

        Raises:
            InvalidArgumentError: ``payload`` is not as many bytes as asked for (nothing
                placed).
        """
        part, parts = self.ids.shards[shard], self.ids.parts(shard)
        sizes = [(hi - lo) * (8 + 4 * self._widths[t]) for t, lo, hi in parts]
        if len(payload) != sum(sizes):
            raise InvalidArgumentError(
                f"an update's state must hold {sum(sizes)} bytes ({part.bounds[-1]} ids), "
                f"got {len(payload)}"
            )
        offset = 0
        for (t, lo, hi), size in zip(parts, sizes):
            count, width = hi - lo, self._widths[t]
            where = part.positions[lo:hi] - self.ids.starts[t]
            self._versions[t][where] = np.frombuffer(payload, "<i8", count, offset)
            state = np.frombuffer(payload, "<f4", count * width, offset + 8 * count)
            self._state[t][where] = state.reshape(count, width)
            offset += size

    def states(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """``{table: (versions [n], state [n, width])}`` in the caller's order of tables and
        ids; all placed once every shard's answer is."""
        joined = {
            table: (torch.from_numpy(versions), torch.from_numpy(state))
            for table, versions, state in zip(self.ids.tables, self._versions, self._state)
        }
        return {table: joined[table] for table in self.ids.order}
