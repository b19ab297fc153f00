"""Request handling of one shard: validation, ownership and the table registry.

``ParameterServer`` is transport-free: it takes the packed request fields and
returns packed replies, raising :mod:`ember.ps_server.errors` on bad input
before anything is applied. The gRPC servicer (and any other transport) is a
thin facade over it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from typing import TYPE_CHECKING

import numpy as np
import torch
from ember.kernels.optim import state_width
from ember.ps_server.durability.auto_checkpoint import AutoCheckpoints
from ember.ps_server.durability.journal import WriteJournal
from ember.ps_server.durability.shard_checkpoint import ShardCheckpoints
from ember.ps_server.durability.shard_fault import ShardFault
from ember.ps_server.errors import (
    InvalidArgumentError,
    TableExistsError,
)
from ember.ps_server.shard.replica_flush import MAX_ASKING
from ember.ps_server.shard.request_checks import RequestChecks, weights_and_int64
from ember.ps_server.shard.steps import StepService
from ember.ps_server.shard.table import Table
from ember.ps_server.shard.write_gate import WriteGate
from ember.ps_server.stores import open_marker, open_store
from ember.ps_server.wire.messages import (
    decode_rows,
    decode_versions,
    pb,
    require_little_endian_host,
)
from ember.ps_server.wire.pull_push_codec import push_log_record
from ember.ps_server.wire.row_dtype import RowDtype
from ember.ps_server.wire.stats import TableStats
from ember.ps_server.wire.table_spec import TableSpec

if TYPE_CHECKING:
    from ember.ps_server.shard.config import ShardConfig

log = logging.getLogger(__name__)


def _pulled_row_words(table: Table, with_state: bool) -> int:
    """The 4-byte words of a pulled row: its weights and version, and its state if asked."""
    return weights_and_int64(table) + (table.store.state_width if with_state else 0)


def _stale_row_words(table: Table) -> int:
    """The 4-byte words of a conditional pull's reply row: its weights, version and position."""
    return weights_and_int64(table) + 2


@dataclasses.dataclass(frozen=True)
class PullReply:
    """Reply of a pull, in request order: float32 rows [n, dim], int64 versions [n] and,
    when asked for, float32 optimizer state [n, width] (else [n, 0])."""

    values: np.ndarray
    versions: np.ndarray
    dim: int
    state: np.ndarray


@dataclasses.dataclass(frozen=True)
class PullStaleReply:
    """Reply of a conditional pull: positions into the request, rows and versions."""

    positions: np.ndarray
    values: np.ndarray
    versions: np.ndarray
    dim: int


class ParameterServer:
    """The tables of shard ``shard`` of ``num_shards``.

    Args:
        shard: this shard's index, 0-based.
        num_shards: number of shards in the cluster.
        max_message_bytes: largest reply this shard will send.
        dedup_window: recent push request ids remembered per table.
        store: where rows live, ``memory`` or a Redis URL (see :func:`open_store`).
        accept_empty_store: when the Redis behind ``store`` loses this shard's
            rows while serving, go on from initial rows instead of stopping.
        checkpoint_root: the only directory checkpoint files may be written
            under ('' refuses every checkpoint request).
        max_waiting: requests that may wait at once, for clocks or held write-back
            reports (None: no limit; a shard process sets it from its worker threads).
        max_asking: checkpoints that may wait at once for replica write-backs.

    Attributes:
        fault: trips when the shard can no longer vouch for its data; from then
            on every data request fails (see :class:`ShardFault`).

    Example:
        >>> server = ParameterServer(shard=0, num_shards=1)
        >>> server.create_table(TableSpec("t", dim=4))
        True
    """

    def __init__(
        self,
        shard: int,
        num_shards: int,
        max_message_bytes: int = 64 << 20,
        dedup_window: int = 65536,
        store: str = "memory",
        accept_empty_store: bool = False,
        checkpoint_root: str = "",
        max_waiting: int | None = None,
        max_asking: int = MAX_ASKING,
    ) -> None:
        require_little_endian_host()
        if not 0 <= shard < num_shards:
            raise ValueError(f"shard must be in 0..{num_shards - 1}, got {shard}")
        self.shard = shard
        self.num_shards = num_shards
        self.max_message_bytes = max_message_bytes
        self._dedup_window = dedup_window
        self.store_url = store
        self._tables: dict[str, Table] = {}
        self._tables_lock = threading.Lock()
        self.checks = RequestChecks(self._tables, shard, num_shards, max_message_bytes)
        self.fault = ShardFault()
        self.store_marker = open_marker(store, shard, num_shards, self.fault, accept_empty_store)
        self.gate = WriteGate()
        self.journal = WriteJournal()
        self.checkpoints = ShardCheckpoints(self, checkpoint_root)
        self.auto_checkpoints: AutoCheckpoints | None = None  # the shard process starts them
        self.steps = StepService(self, max_waiting, max_asking)

    def create_table(self, spec: TableSpec) -> bool:
        """Create a table; returns False if an identical one exists.

        Raises:
            InvalidArgumentError: the spec is invalid.
            TableExistsError: a table of that name has a different spec.
        """
        self.fault.check()
        spec.validate()
        record = pb.LogRecord(create_table=pb.CreateTableRequest(spec=spec.to_proto()))
        with self.gate.writing(), self.journal.record(lambda: [record.SerializeToString()]):
            return self.ensure_table(spec)

    def ensure_table(self, spec: TableSpec) -> bool:
        """:meth:`create_table` for a validated spec, for callers already admitted by the gate."""
        with self._tables_lock:
            existing = self._tables.get(spec.name)
            if existing is None:
                store = open_store(
                    self.store_url,
                    spec.name,
                    self.shard,
                    spec.dim,
                    state_width(spec.optimizer.kind, spec.dim),
                    marker=self.store_marker,
                )
                self._tables[spec.name] = Table(spec, store, self._dedup_window)
                return True
        if existing.spec != spec:
            raise TableExistsError(
                f"table {spec.name!r} exists with a different spec ({existing.spec}); "
                f"requested {spec}"
            )
        return False

    def tables(self) -> dict[str, Table]:
        """The tables, by name (a snapshot of the registry)."""
        with self._tables_lock:
            return dict(sorted(self._tables.items()))

    def list_tables(self) -> list[TableSpec]:
        """Specs of all tables, by name."""
        with self._tables_lock:
            return [self._tables[name].spec for name in sorted(self._tables)]

    def pull(self, table: str, ids: bytes | memoryview, with_state: bool = False) -> PullReply:
        """Rows and versions (and state) for packed ``ids`` (duplicates allowed), in order."""
        return self.pull_batch([(table, ids, with_state)])[0]

    def pull_batch(self, requests: list[tuple[str, bytes | memoryview, bool]]) -> list[PullReply]:
        """Several pulls ``(table, ids, with_state)``, all validated before any row is read.

        Raises:
            MessageTooLargeError: the replies together exceed the message limit.
        """
        self.fault.check()
        validated = []
        for table, ids, with_state in requests:
            row_words = functools.partial(_pulled_row_words, with_state=with_state)
            target, id_array = self.checks.reads([(table, ids)], row_words)[0]
            validated.append((target, id_array, row_words(target), with_state))
        self.checks.replies_fit([(target, len(ids), words) for target, ids, words, _ in validated])
        replies = []
        for target, id_array, _, with_state in validated:
            rows = target.pull(id_array, with_state)
            replies.append(
                PullReply(
                    values=rows.weights.numpy(),
                    versions=rows.versions.numpy(),
                    dim=target.spec.dim,
                    state=rows.state.numpy(),
                )
            )
        return replies

    def pull_stale(
        self, table: str, ids: bytes | memoryview, held_versions: bytes | memoryview, bound: int
    ) -> PullStaleReply:
        """Rows of packed ``ids`` whose version exceeds the caller's by more than ``bound``."""
        return self.pull_stale_batch([(table, ids, held_versions, bound)])[0]

    def pull_stale_batch(
        self, requests: list[tuple[str, bytes | memoryview, bytes | memoryview, int]]
    ) -> list[PullStaleReply]:
        """Several conditional pulls ``(table, ids, held_versions, bound)``, all validated first.

        Raises:
            MessageTooLargeError: the replies could together exceed the message limit.
        """
        self.fault.check()
        validated = []
        for table, ids, held_versions, bound in requests:
            target, id_array = self.checks.reads([(table, ids)], _stale_row_words)[0]
            validated.append(
                (target, id_array, decode_versions(held_versions, len(id_array)), bound)
            )
        self.checks.replies_fit([(t, len(ids), _stale_row_words(t)) for t, ids, _, _ in validated])
        replies = []
        for target, id_array, held, bound in validated:
            positions, weights, versions = target.pull_stale(id_array, held, bound)
            replies.append(
                PullStaleReply(
                    positions=positions,
                    values=weights.numpy(),
                    versions=versions.numpy(),
                    dim=target.spec.dim,
                )
            )
        return replies

    def push(
        self, table: str, ids: bytes | memoryview, grads: bytes | memoryview, request_id: str
    ) -> tuple[bool, int]:
        """Apply packed gradients; returns ``(duplicate, rows_updated)``.

        Raises:
            InvalidArgumentError: malformed bytes, negative id, non-finite
                gradient or empty request id (nothing applied).
        """
        return self.push_batch([(table, ids, grads, request_id)])[0]

    def push_batch(
        self, requests: list[tuple[str, bytes | memoryview, bytes | memoryview, str]]
    ) -> list[tuple[bool, int]]:
        """Apply several pushes ``(table, ids, grads, request_id)``, all validated before any is applied."""
        self.fault.check()
        validated = [self._validate_push(*request) for request in requests]

        with self.gate.writing(), self.journal.record(lambda: push_log_record(requests)):
            return [
                target.push(ids, torch.from_numpy(grads.copy()), request_id)
                if len(ids)
                else (False, 0)
                for target, ids, grads, request_id in validated
            ]

    def _validate_push(
        self, table: str, ids: bytes | memoryview, grads: bytes | memoryview, request_id: str
    ) -> tuple[Table, np.ndarray, np.ndarray, str]:
        if not request_id:
            raise InvalidArgumentError("push needs a non-empty request_id for retry deduplication")
        return (*self.checks.writes([(table, ids, grads, RowDtype.FLOAT32)])[0], request_id)

    def assign(
        self,
        table: str,
        ids: bytes | memoryview,
        values: bytes | memoryview,
        state: bytes | memoryview,
        request_id: str,
        versions: bytes | memoryview = b"",
    ) -> bool:
        """Overwrite rows (their optimizer state when ``state`` is not empty, their versions when
        ``versions`` is not empty, else each version + 1); returns duplicate."""
        self.fault.check()
        target = self.checks.table(table)
        if not request_id:
            raise InvalidArgumentError(
                "assign needs a non-empty request_id for retry deduplication"
            )
        id_array = self.checks.ids([table], [ids])[0]  # sign and ownership too
        if len(np.unique(id_array)) != len(id_array):
            raise InvalidArgumentError("assign needs distinct ids")
        weights = decode_rows(values, len(id_array), target.spec.dim, "values")
        width = target.store.state_width
        state_rows = decode_rows(state, len(id_array), width, "state") if len(state) else None
        for name, rows in (("values", weights), ("state", state_rows)):
            if rows is not None and not np.isfinite(rows).all():
                raise InvalidArgumentError(
                    f"{name} for table {table!r} contain NaN or Inf; nothing was applied"
                )
        version_array = decode_versions(versions, len(id_array)) if len(versions) else None
        if version_array is not None and len(version_array) and version_array.min() < 0:
            raise InvalidArgumentError(f"versions must be >= 0, got {int(version_array.min())}")
        if len(id_array) == 0:
            return False
        state_tensor = None if state_rows is None else torch.from_numpy(state_rows.copy())
        version_tensor = None if version_array is None else torch.from_numpy(version_array.copy())

        def record() -> list[bytes]:
            assignment = pb.AssignRequest(
                table=table, ids=bytes(ids), values=bytes(values), state=bytes(state),
                request_id=request_id, versions=bytes(versions),
            )  # fmt: skip
            return [pb.LogRecord(assign=assignment).SerializeToString()]

        with self.gate.writing(), self.journal.record(record):
            return target.assign(
                id_array, torch.from_numpy(weights.copy()), state_tensor, version_tensor, request_id
            )

    def stats(self, sizes: bool = True) -> list[TableStats]:
        """Per-table rows, bytes and traffic counters (rows and bytes 0 unless ``sizes``).

        Sizes of Redis-backed tables cost a scan of their keys.
        """
        with self._tables_lock:
            tables = [self._tables[name] for name in sorted(self._tables)]
        return [
            TableStats(
                t.spec.name,
                t.spec.dim,
                *(t.footprint() if sizes else (0, 0)),
                counters=dataclasses.replace(t.counters),
            )
            for t in tables
        ]

    def flush(self) -> None:
        """Write rows held in front of each table's backing store through to it (at shutdown).

        Skipped once the shard's fault has tripped: its data is no longer vouched for.
        """
        if self.fault.reason is not None:
            log.warning("not flushing the tables' memory tiers: %s", self.fault.reason)
            return
        with self._tables_lock:
            tables = list(self._tables.values())
        for table in tables:
            table.flush()


def parameter_server_for(config: ShardConfig) -> ParameterServer:
    """The shard logic ``config`` describes, its waits sized from its worker threads."""
    return ParameterServer(
        config.shard,
        config.num_shards,
        config.max_message_bytes,
        config.dedup_window,
        config.store,
        accept_empty_store=config.accept_empty_store,
        checkpoint_root=config.checkpoint_root,
        max_waiting=config.max_waiting,
        max_asking=config.max_asking,
    )
