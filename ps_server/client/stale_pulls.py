"""Version-checked pulls (PullStale): the rows a trainer's cache holds copies of that changed
on the shards by more than its staleness bound, for many tables in one round trip per shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from ember.ps_server.client.shard_rpc import ShardCall
from ember.ps_server.errors import PSClientError, Status
from ember.ps_server.id_arrays import as_id_array
from ember.ps_server.wire.messages import encode_ids, pb

if TYPE_CHECKING:
    from ember.ps_server.client.ps_client import PSClient


def pull_stale_many(
    client: PSClient, requests: Sequence[tuple[str, Any, Any, int]]
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """For each ``(table, ids, held_versions, bound)``, the rows whose shard version exceeds
    the held one by more than ``bound`` (a held version of -1 is always stale, so misses
    can ride along), as ``(positions into ids ascending, rows [k, dim], versions [k])``.

    Raises:
        ValueError: held versions of another shape than the ids, or a negative bound
            (nothing sent).
    """
    calls: list[ShardCall] = []
    sizes: list[int] = []
    targets: list[tuple[int, np.ndarray]] = []
    dims = []
    for number, (table, ids, held_versions, bound) in enumerate(requests):
        id_array = as_id_array(ids)
        held = np.ascontiguousarray(torch.as_tensor(held_versions).cpu().numpy(), dtype=np.int64)
        if held.shape != id_array.shape:
            raise ValueError(f"held_versions must have shape {id_array.shape}, got {held.shape}")
        if bound < 0:
            raise ValueError(f"bound must be >= 0, got {bound}")
        dims.append(client.dim(table))
        for shard, chunk in client.message_chunks(table, id_array, bytes_per_row=4 * dims[-1] + 24):
            request = pb.PullStaleRequest(
                table=table,
                ids=encode_ids(id_array[chunk]),
                held_versions=held[chunk].tobytes(),
                bound=bound,
            )
            calls.append(ShardCall(shard, "PullStale", request))
            targets.append((number, chunk))
            sizes.append(len(chunk) * (4 * dims[-1] + 32))
    parts: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = [[] for _ in requests]
    replies = client.shard_rpc.run_packed(calls, sizes, single_table=len(requests) == 1)
    for call, (number, chunk), reply in zip(calls, targets, replies):
        try:
            positions, rows, versions = _stale_rows(reply, len(chunk), dims[number])
        except ValueError as error:
            endpoint = client.endpoints[call.shard]
            raise PSClientError(endpoint, Status.INTERNAL, f"PullStale: {error}") from None
        parts[number].append((chunk[positions], rows, versions))
    results = []
    for dim, pieces in zip(dims, parts):
        positions = np.concatenate([p for p, _, _ in pieces] or [np.empty(0, np.int64)])
        rows = np.concatenate([r for _, r, _ in pieces] or [np.empty((0, dim), np.float32)])
        versions = np.concatenate([v for _, _, v in pieces] or [np.empty(0, np.int64)])
        order = np.argsort(positions, kind="stable")
        results.append(
            (
                torch.from_numpy(positions[order]),
                torch.from_numpy(rows[order]),
                torch.from_numpy(versions[order]),
            )
        )
    return results


def _stale_rows(reply: Any, asked: int, dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A PullStale reply's positions, rows [k, dim] and versions, checked against each other
    and the ``asked`` ids.

    Raises:
        ValueError: parts of other lengths, or a position outside the ids asked for.
    """
    if len(reply.positions) % 8 or len(reply.versions) % 8 or len(reply.values) % (4 * dim):
        raise ValueError("an answer whose parts are not whole positions, rows and versions")
    positions = np.frombuffer(reply.positions, dtype=np.int64)
    rows = np.frombuffer(reply.values, dtype=np.float32).reshape(-1, dim)
    versions = np.frombuffer(reply.versions, dtype=np.int64)
    if not len(positions) == len(rows) == len(versions):
        raise ValueError(
            f"an answer of {len(positions)} positions, {len(rows)} rows and "
            f"{len(versions)} versions"
        )
    if len(positions) and (positions.min() < 0 or positions.max() >= asked):
        raise ValueError(f"an answer naming positions outside the {asked} ids asked for")
    return positions, rows, versions
