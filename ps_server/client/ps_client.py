"""PSClient: the Python client of a sharded Ember parameter-server cluster.

Validates input before anything is sent, routes ids to shards by hash, splits
batches below the gRPC message limit and assembles replies in the caller's
order. Sending, retrying and batching live in :mod:`ember.ps_server.client.shard_rpc`,
version-checked pulls in :mod:`ember.ps_server.client.stale_pulls`.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import numpy as np
import torch
from ember.kernels.optim import state_width
from ember.kernels.rows import scatter_rows
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.client.shard_rpc import REQUEST_OVERHEAD_BYTES, ShardCall, ShardRPC
from ember.ps_server.client.stale_pulls import pull_stale_many
from ember.ps_server.errors import PSClientError, Status
from ember.ps_server.id_arrays import as_grad_rows, as_id_array, sum_duplicates
from ember.ps_server.routing import positions_by_shard, shard_of
from ember.ps_server.wire.messages import (
    encode_ids,
    pb,
    readonly_tensor,
    require_little_endian_host,
)
from ember.ps_server.wire.pull_push_codec import PullReplyView, encode_push_request
from ember.ps_server.wire.stats import ShardStats
from ember.ps_server.wire.table_spec import TableSpec


class PSClient:
    """Client of the shards listed in ``endpoints`` (shard k at ``endpoints[k]``).

    Args:
        endpoints: ``host:port`` of every shard, in shard order.
        config: deadlines, retry policy and message limit.

    Example:
        >>> with PSClient(["127.0.0.1:50051", "127.0.0.1:50052"]) as client:  # doctest: +SKIP
        ...     client.create_table(TableSpec("user", dim=16))
        ...     rows = client.pull("user", torch.tensor([3, 1, 3]))   # [3, 16], row 0 == row 2
        ...     client.push("user", torch.tensor([3]), torch.ones(1, 16))
    """

    def __init__(self, endpoints: Sequence[str], config: ClientConfig | None = None) -> None:
        require_little_endian_host()
        endpoints = list(endpoints)
        if not endpoints:
            raise ValueError("PSClient needs at least one shard endpoint")
        if len(set(endpoints)) != len(endpoints):
            raise ValueError(f"shard endpoints must be distinct: {endpoints}")
        self.config = config or ClientConfig()
        self.config.validate()
        self.endpoints = endpoints
        self._rpc = ShardRPC(endpoints, self.config)
        self._specs: dict[str, TableSpec] = {}
        self._client_id = uuid.uuid4().hex
        self._sequence = itertools.count()
        self._topology_checked = False

    @property
    def shard_rpc(self) -> ShardRPC:
        """The channels to the shards, for other clients of the same cluster (StepClient)."""
        return self._rpc

    @property
    def num_shards(self) -> int:
        """Number of shards this client routes to."""
        return len(self.endpoints)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the channels to all shards."""
        self._rpc.close()

    def create_table(self, spec: TableSpec) -> None:
        """Create ``spec`` on every shard (idempotent for an identical spec).

        Raises:
            ValueError: the spec is invalid (nothing sent).
            PSClientError: ALREADY_EXISTS if a different spec has that name.
        """
        spec.validate()
        self.ensure_topology()
        request = pb.CreateTableRequest(spec=spec.to_proto())
        self._rpc.run([ShardCall(k, "CreateTable", request) for k in range(self.num_shards)])
        self._specs[spec.name] = spec

    def list_tables(self) -> list[TableSpec]:
        """Specs of all tables (as shard 0 reports them)."""
        (reply,) = self._rpc.run([ShardCall(0, "ListTables", pb.ListTablesRequest())])
        specs = [TableSpec.from_proto(message) for message in reply.tables]
        self._specs.update({spec.name: spec for spec in specs})
        return specs

    def spec(self, table: str) -> TableSpec:
        """The spec of ``table``.

        Raises:
            PSClientError: NOT_FOUND if the table does not exist.
        """
        if table not in self._specs:
            self.list_tables()
        if table not in self._specs:
            raise PSClientError(
                self.endpoints[0], Status.NOT_FOUND, f"table {table!r} does not exist"
            )
        return self._specs[table]

    def dim(self, table: str) -> int:
        """Row width of ``table`` (NOT_FOUND as :meth:`spec`)."""
        return self.spec(table).dim

    def pull(self, table: str, ids: Any) -> torch.Tensor:
        """Rows of ``ids`` (any order, duplicates allowed) as float32 [len(ids), dim]."""
        return self.pull_with_versions(table, ids)[0]

    def pull_with_versions(self, table: str, ids: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows [n, dim] float32 and their versions [n] int64, in the order of ``ids``."""
        return self.pull_many({table: ids})[table]

    def pull_many(
        self, requests: Mapping[str, Any]
    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Pull several tables at once: all their shard requests run concurrently.

        Returns:
            ``{table: (rows, versions)}`` as :meth:`pull_with_versions` gives them.
        """
        return {
            table: (rows, versions)
            for table, (rows, _, versions) in self._pull(requests, with_state=False).items()
        }

    def pull_with_state(
        self, table: str, ids: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rows [n, dim], their optimizer state [n, width] and versions [n], in the order of
        ``ids`` (zeros and version 0 for rows never written), e.g. to take rows over."""
        return self._pull({table: ids}, with_state=True)[table]

    def _pull(
        self, requests: Mapping[str, Any], with_state: bool
    ) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """``{table: (rows, state, versions)}``; the state has width 0 unless ``with_state``."""
        results: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        calls: list[ShardCall] = []
        sizes: list[int] = []
        targets: list[tuple[tuple[torch.Tensor, ...], np.ndarray]] = []
        for table, ids in requests.items():
            id_array = as_id_array(ids)
            spec = self.spec(table)
            width = state_width(spec.optimizer.kind, spec.dim) if with_state else 0
            rows = (
                torch.empty(len(id_array), spec.dim, dtype=torch.float32),
                torch.empty(len(id_array), width, dtype=torch.float32),
                torch.empty(len(id_array), dtype=torch.int64),
            )
            results[table] = rows
            row_bytes = 4 * (spec.dim + width) + 8
            for shard, chunk in self.message_chunks(table, id_array, bytes_per_row=row_bytes):
                request = pb.PullRequest(
                    table=table, ids=encode_ids(id_array[chunk]), with_state=with_state
                )
                calls.append(ShardCall(shard, "Pull", request))
                targets.append((rows, chunk))
                sizes.append(len(chunk) * (row_bytes + 8))

        def place(index: int, reply: PullReplyView) -> None:
            # Runs while other shards' replies are still in flight.
            rows, chunk = targets[index]
            positions = torch.from_numpy(chunk)
            for into, data in zip(rows, (reply.values, reply.state, reply.versions)):
                if into.numel():
                    payload = readonly_tensor(data, into.dtype)
                    scatter_rows(into, positions, payload.view(len(chunk), *into.shape[1:]))

        self._rpc.run_packed(calls, sizes, on_reply=place, single_table=len(requests) == 1)
        return results

    def pull_stale(
        self, table: str, ids: Any, held_versions: Any, bound: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rows whose shard version exceeds ``held_versions`` by more than ``bound``.

        Args:
            table: table name.
            ids: ids the caller holds copies of.
            held_versions: the version of each copy, int64 [len(ids)].
            bound: staleness the caller tolerates, in updates (>= 0).

        Returns:
            ``(positions, rows, versions)``: ascending positions into ``ids`` of
            the stale rows, their float32 rows [k, dim] and current versions.
        """
        return self.pull_stale_many([(table, ids, held_versions, bound)])[0]

    def pull_stale_many(
        self, requests: Sequence[tuple[str, Any, Any, int]]
    ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """:meth:`pull_stale` for each ``(table, ids, held_versions, bound)``, in one round trip
        per shard. A held version of -1 always counts as stale, so misses can ride along."""
        return pull_stale_many(self, requests)

    def push(self, table: str, ids: Any, grads: Any) -> None:
        """Send gradients [len(ids), dim]; duplicate ids are summed before sending.

        Raises:
            ValueError: bad ids, shape, dtype or a NaN/Inf gradient (nothing sent).
            PSClientError: a shard rejected the push or stayed unavailable.
        """
        self.push_many({table: (ids, grads)})

    def push_many(self, updates: Mapping[str, tuple[Any, Any]]) -> None:
        """Push ``{table: (ids, grads)}`` for several tables at once, concurrently.

        Every table's input is validated before anything is sent.
        """
        prepared = []
        for table, (ids, grads) in updates.items():
            id_array = as_id_array(ids)
            dim = self.dim(table)
            unique_ids, summed = sum_duplicates(id_array, as_grad_rows(grads, len(id_array), dim))
            prepared.append((table, dim, unique_ids, summed.numpy()))
        request_id = f"{self._client_id}:{next(self._sequence)}"
        single_table = len(prepared) == 1
        calls, sizes = [], []
        for table, dim, unique_ids, summed in prepared:
            for number, (shard, chunk) in enumerate(
                self.message_chunks(table, unique_ids, bytes_per_row=4 * dim + 8)
            ):
                sub_id = f"{request_id}:{table}:{shard}:{number}"
                # One table: the zero-copy encoding; several: entries of a PushBatch.
                encode = encode_push_request if single_table else _push_request
                calls.append(
                    ShardCall(
                        shard, "Push", encode(table, unique_ids[chunk], summed[chunk], sub_id)
                    )
                )
                sizes.append(len(chunk) * (4 * dim + 8))
        self._rpc.run_packed(calls, sizes, single_table=single_table)

    def assign(
        self, table: str, ids: Any, values: Any, state: Any = None, versions: Any = None
    ) -> None:
        """Overwrite rows of distinct ``ids`` with ``values`` [n, dim], and optimizer ``state``
        [n, width] and ``versions`` [n] when given (else each row's version grows by one)."""
        id_array = as_id_array(ids)
        if len(np.unique(id_array)) != len(id_array):
            raise ValueError("assign needs distinct ids")
        spec = self.spec(table)
        dim, width = spec.dim, state_width(spec.optimizer.kind, spec.dim)
        rows = as_grad_rows(values, len(id_array), dim).numpy()
        state_rows = None
        if state is not None:
            state_rows = as_grad_rows(state, len(id_array), width).numpy()
        version_array = None
        if versions is not None:
            version_array = as_id_array(versions)  # int64 >= 0, like ids
            if version_array.shape != id_array.shape:
                raise ValueError(f"versions must have shape {id_array.shape}")
        request_id = f"{self._client_id}:{next(self._sequence)}"
        calls = [
            ShardCall(
                shard,
                "Assign",
                pb.AssignRequest(
                    table=table,
                    ids=encode_ids(id_array[chunk]),
                    values=rows[chunk].tobytes(),
                    state=b"" if state_rows is None else state_rows[chunk].tobytes(),
                    request_id=f"{request_id}:{shard}:{number}",
                    versions=b"" if version_array is None else version_array[chunk].tobytes(),
                ),
            )
            for number, (shard, chunk) in enumerate(
                self.message_chunks(table, id_array, bytes_per_row=4 * (dim + width) + 16)
            )
        ]
        self._rpc.run(calls)

    def stats(self, sizes: bool = True) -> list[ShardStats]:
        """Stats of every shard, in shard order (rows and bytes 0 unless ``sizes``)."""
        request = pb.StatsRequest(without_sizes=not sizes)
        replies = self._rpc.run([ShardCall(k, "Stats", request) for k in range(self.num_shards)])
        return [ShardStats.from_proto(self.endpoints[k], reply) for k, reply in enumerate(replies)]

    def checkpoint(
        self,
        root: str | Path,
        incremental: bool = False,
        lease_s: float | None = None,
        flush_wait_s: float | None = None,
        release: Sequence[str] = (),
    ) -> Path:
        """Write a consistent checkpoint of every shard under ``root``; returns its directory.

        Training jobs that hold hot-row replicas write them back first; ``release`` names
        jobs that died holding them, not waited for from now on. See
        :func:`ember.ps_server.durability.checkpoint_coordinator.take_checkpoint` (``root`` must be a
        path every shard can write; this client's ``timeout_s`` must cover the slowest
        shard's write). ``lease_s`` and ``flush_wait_s`` default to the coordinator's.
        """
        # Imported here: the client proper loads no durability module (an operator's call).
        from ember.ps_server.durability import checkpoint_coordinator as coordinator

        self.ensure_topology()
        lease_s = coordinator.DEFAULT_LEASE_S if lease_s is None else lease_s
        wait_s = coordinator.DEFAULT_FLUSH_WAIT_S if flush_wait_s is None else flush_wait_s
        directory, _ = coordinator.take_checkpoint(
            self._rpc, Path(root), incremental, lease_s, wait_s, release
        )
        return directory

    def ensure_topology(self) -> None:
        """Check once that endpoint k reports shard k of len(endpoints), and connect the data
        plane the config asks for to what the shards offer."""
        if self._topology_checked:
            return
        shards = self.stats(sizes=False)
        for stats in shards:
            expected = self.endpoints.index(stats.endpoint)
            if (stats.shard, stats.num_shards) != (expected, self.num_shards):
                raise PSClientError(
                    stats.endpoint,
                    Status.FAILED_PRECONDITION,
                    f"endpoint is shard {stats.shard} of {stats.num_shards}, but this client lists it "
                    f"as shard {expected} of {self.num_shards}; pass endpoints in shard order",
                )
        self._rpc.connect_data_plane([stats.data_planes for stats in shards])
        self._topology_checked = True

    def message_chunks(
        self, table: str, ids: np.ndarray, bytes_per_row: int
    ) -> list[tuple[int, np.ndarray]]:
        """(shard, positions into ids) pairs, each small enough for one message."""
        self.ensure_topology()
        rows_per_message = max(
            1, (self.config.max_message_bytes - REQUEST_OVERHEAD_BYTES) // bytes_per_row
        )
        groups = positions_by_shard(shard_of(table, ids, self.num_shards), self.num_shards)
        return [
            (shard, positions[start : start + rows_per_message])
            for shard, positions in enumerate(groups)
            for start in range(0, len(positions), rows_per_message)
        ]


def _push_request(
    table: str, ids: np.ndarray, grads: np.ndarray, request_id: str
) -> pb.PushRequest:
    return pb.PushRequest(
        table=table, ids=encode_ids(ids), grads=grads.tobytes(), request_id=request_id
    )
