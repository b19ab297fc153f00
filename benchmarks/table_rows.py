"""Tables of the benchmarks, filled before timing."""

from __future__ import annotations

import torch
from ember.ps_server.client.ps_client import PSClient

CHUNK_ROWS = 1 << 17  # 32 MiB of dim-64 gradients per push, under the message limit


def create_rows(client: PSClient, table: str, num_rows: int, dim: int) -> None:
    """Store rows ``0 .. num_rows - 1`` of ``table`` (an SGD table: a zero gradient leaves each
    row at its initial value). Reads never create rows; without this, every timed read of an
    id never written would compute its initial row again."""
    for start in range(0, num_rows, CHUNK_ROWS):
        ids = torch.arange(start, min(start + CHUNK_ROWS, num_rows))
        client.push(table, ids, torch.zeros(len(ids), dim))
