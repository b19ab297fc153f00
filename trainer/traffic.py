"""Payload accounting of a trainer's parameter-server traffic."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch


@dataclasses.dataclass
class TrafficStats:
    """Rows and payload bytes (rows, ids, versions) that crossed the network."""

    rows_pulled: int = 0
    rows_pushed: int = 0
    bytes_pulled: int = 0
    bytes_pushed: int = 0


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
            self._pulled(table, sent=8 * len(ids), rows=len(ids))
        return pulled

    def pull_with_state(
        self, table: str, ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As PSClient.pull_with_state."""
        rows, state, versions = self.client.pull_with_state(table, ids)
        self._pulled(table, sent=8 * len(ids), rows=len(ids), extra=4 * state.numel())
        return rows, state, versions

    def pull_stale_many(
        self, requests: Sequence[tuple[str, torch.Tensor, torch.Tensor, int]]
    ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """As PSClient.pull_stale_many."""
        if not requests:
            return []
        replies = self.client.pull_stale_many(requests)
        for (table, ids, _, _), (positions, _, _) in zip(requests, replies):
            self._pulled(table, sent=16 * len(ids), rows=len(positions), extra=8 * len(positions))
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
        self.traffic.bytes_pushed += 16 * len(ids) + 4 * (values.numel() + state.numel())

    def _pulled(self, table: str, sent: int, rows: int, extra: int = 0) -> None:
        self.traffic.rows_pulled += rows
        self.traffic.bytes_pulled += sent + rows * (4 * self.dim(table) + 8) + extra
