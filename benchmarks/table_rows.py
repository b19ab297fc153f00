"""Tables of the benchmarks, filled before timing."""

from __future__ import annotations

import torch
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.wire.table_spec import OptimizerKind

CHUNK_ROWS = 1 << 17  # rows per push: bounds the client's memory for the gradients


def create_rows(client: PSClient, table: str, num_rows: int, dim: int) -> None:
    """Store rows ``0 .. num_rows - 1`` of ``table`` at their initial values. Reads never
    create rows; without this, every timed read of an id never written would compute its
    initial row again.

    Raises:
        ValueError: ``table`` is not plain SGD, where a zero gradient would still change
            rows (weight decay) or optimizer state (Adam's step count).
    """
    optimizer = client.spec(table).optimizer
    if optimizer.kind is not OptimizerKind.SGD or optimizer.weight_decay:
        raise ValueError(f"create_rows pushes zero gradients: {table!r} must be plain SGD")
    for start in range(0, num_rows, CHUNK_ROWS):
        ids = torch.arange(start, min(start + CHUNK_ROWS, num_rows))
        client.push(table, ids, torch.zeros(len(ids), dim))
