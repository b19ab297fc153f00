"""An in-process stand-in for PSClient, for unit tests of the logic above the client.

It keeps rows in a dict, applies SGD on push, bumps versions like a shard and
records every push; integration tests use real shards.
"""

from __future__ import annotations

import numpy as np
import torch


class FakePSClient:
    def __init__(self, dim: int, lr: float = 0.1, seed: int = 0) -> None:
        self._dim, self.lr = dim, lr
        self.rows: dict[tuple[str, int], torch.Tensor] = {}
        self.versions: dict[tuple[str, int], int] = {}
        self.pushed: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        self._rng = np.random.default_rng(seed)

    def dim(self, table: str) -> int:
        return self._dim

    def _row(self, table: str, row_id: int) -> torch.Tensor:
        key = (table, row_id)
        if key not in self.rows:
            self.rows[key] = torch.from_numpy(
                self._rng.standard_normal(self._dim).astype(np.float32)
            )
            self.versions[key] = 0
        return self.rows[key]

    def pull_many(self, requests):
        out = {}
        for table, ids in requests.items():
            rows = (
                torch.stack([self._row(table, i) for i in ids.tolist()])
                if len(ids)
                else torch.empty(0, self._dim)
            )
            versions = torch.tensor(
                [self.versions[(table, i)] for i in ids.tolist()], dtype=torch.int64
            )
            out[table] = (rows.clone(), versions)
        return out

    def pull_stale_many(self, requests):
        out = []
        for table, ids, held, bound in requests:
            self.pull_many({table: ids})
            current = torch.tensor(
                [self.versions[(table, i)] for i in ids.tolist()], dtype=torch.int64
            )
            positions = ((current - torch.as_tensor(held)) > bound).nonzero().squeeze(1)
            rows, versions = self.pull_many({table: ids[positions]})[table]
            out.append((positions, rows, versions))
        return out

    def push_many(self, updates):
        for table, (ids, grads) in updates.items():
            self.pushed.append((table, ids.clone(), grads.clone()))
            for row_id, grad in zip(ids.tolist(), grads):
                self.rows[(table, row_id)] = self._row(table, row_id) - self.lr * grad
                self.versions[(table, row_id)] += 1
