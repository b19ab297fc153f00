"""Payload accounting of a trainer's parameter-server traffic."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch


@dataclasses.dataclass
class TrafficStats:
    """Rows and bytes that crossed the network, by category.

    ``bytes_pulled``: ids asked for and the rows (and optimizer state) received;
    ``bytes_pushed``: ids and gradients (or assigned rows) sent; ``bytes_control``:
    everything else: versions, freshness checks, positions, clocks and message framing;
    ``bytes_replica_sync``: loading hot-row replicas from the shards and writing them back,
    once per run (and flush), not per step.
    """

    rows_pulled: int = 0
    rows_pushed: int = 0
    bytes_pulled: int = 0
    bytes_pushed: int = 0
    bytes_control: int = 0
    bytes_replica_sync: int = 0


class CountingClient:
    """Wraps a PSClient (or anything with its methods) and counts what each call moves.

    Pulls count the ids (and held versions) sent and the rows with their versions
    received; pushes count the ids and gradient rows sent. Empty updates are not sent.
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self.traffic = TrafficStats()

    def dim(self, table: str) -> int:
        """Row width of ``table``."""
        return self.client.dim(table)

    def pull_many(
        self, requests: Mapping[str, torch.Tensor]
    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """As PSClient.pull_many."""
        if not requests:
            return {}
        pulled = self.client.pull_many(requests)
        for table, ids in requests.items():
            self._pulled(table, asked=len(ids), rows=len(ids), control=8 * len(ids))
        return pulled

    def pull_with_state(
        self, table: str, ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As PSClient.pull_with_state."""
        rows, state, versions = self.client.pull_with_state(table, ids)
        self._pulled(
            table, asked=len(ids), rows=len(ids), control=8 * len(ids), state=state.numel()
        )
        return rows, state, versions

    def pull_stale_many(
        self, requests: Sequence[tuple[str, torch.Tensor, torch.Tensor, int]]
    ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """As PSClient.pull_stale_many."""
        if not requests:
            return []
        replies = self.client.pull_stale_many(requests)
        for (table, ids, held, _), (positions, _, _) in zip(requests, replies):
            # A miss (held -1) asks for its row; a check of a cached row is all control.
            misses = int((torch.as_tensor(held) < 0).sum())
            control = 8 * len(ids) + 8 * (len(ids) - misses) + 16 * len(positions)
            self._pulled(table, asked=misses, rows=len(positions), control=control)
        return replies

    def push_many(self, updates: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """As PSClient.push_many, leaving out tables with nothing to push."""
        updates = {table: update for table, update in updates.items() if len(update[0])}
        if not updates:
            return
        self.client.push_many(updates)
        for table, (ids, _) in updates.items():
            self.traffic.rows_pushed += len(ids)
            self.traffic.bytes_pushed += len(ids) * (8 + 4 * self.dim(table))

    def assign(
        self,
        table: str,
        ids: torch.Tensor,
        values: torch.Tensor,
        state: torch.Tensor,
        versions: torch.Tensor,
    ) -> None:
        """As PSClient.assign, with state and versions."""
        self.client.assign(table, ids, values, state, versions)
        self.traffic.rows_pushed += len(ids)
        self.traffic.bytes_pushed += 8 * len(ids) + 4 * (values.numel() + state.numel())
        self.traffic.bytes_control += 8 * len(ids)

    def _pulled(self, table: str, asked: int, rows: int, control: int, state: int = 0) -> None:
        """Count ``asked`` ids sent, ``rows`` rows (and ``state`` floats) received, and
        ``control`` bytes of versions and positions."""
        self.traffic.rows_pulled += rows
        self.traffic.bytes_pulled += 8 * asked + 4 * (rows * self.dim(table) + state)
        self.traffic.bytes_control += control
