"""WriteJournal: puts a shard's writes in one order and logs each before it is applied.

Without a :class:`WriteLog` attached it does nothing. With one, every write
request is appended to the log (one record per request: group commit of all
its sub-requests) and applied under one lock, so the log's order is the
order of application, and the request is acknowledged only after
:meth:`WriteLog.sync`. A logged request whose application then fails before
its store was written (unreachable) is applied at replay: an unacknowledged
request may be applied, never twice (replay keeps the request-id
deduplication). One whose store write was in flight when the connection failed
may be in the store, unrecorded, so a retry would apply it again: the shard
stops serving, and its restart rebuilds the store's rows from the checkpoint
and the log, where the request is applied once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ember.ps_server.durability.recovery_progress import RecoveryProgress
from ember.ps_server.durability.write_log import WriteLog
from ember.ps_server.errors import StoreCorruptError, StoreWriteUnknownError, TableExistsError
from ember.ps_server.wire.messages import pb
from ember.ps_server.wire.proto_wire import Buffer
from ember.ps_server.wire.table_spec import TableSpec

if TYPE_CHECKING:
    from ember.ps_server.shard.server import ParameterServer

log = logging.getLogger(__name__)


class WriteJournal:
    """Orders and logs the write requests of one shard (see the module docstring)."""

    def __init__(self) -> None:
        self.log: WriteLog | None = None
        self._order = threading.Lock()

    @contextlib.contextmanager
    def record(self, build: Callable[[], list[Buffer]]) -> Iterator[None]:
        """Log the serialised ``LogRecord`` whose buffers ``build`` returns, run the block (the
        write), then wait until the record is durable. A store write of unknown outcome, or a
        corrupt store, in the block stops the shard (see the module docstring)."""
        if self.log is None:
            yield
            return
        with self._order:
            ticket = self.log.append(build())
            try:
                yield
            except StoreWriteUnknownError as error:
                self.log.fault.trip(
                    f"a logged write failed in the store ({error}); the store may hold it, "
                    "and a retry would apply it again. Restart the shard: it rebuilds its "
                    "rows from the checkpoint and the write-ahead log, which holds the write",
                    restartable=True,
                )
                raise
            except StoreCorruptError as error:  # for an operator: a restart would wipe it
                self.log.fault.trip(
                    f"a logged write found the store corrupt ({error}). Look at the store, "
                    "then restart the shard: it rebuilds its rows from the checkpoint and the "
                    "write-ahead log, which holds the write"
                )
                raise
        self.log.sync(ticket)

    def durable(self) -> None:
        """Return once every logged write is durable: a retry answered as a duplicate of a
        write is acknowledged only once that write could be.

        Raises:
            ShardFailedError: the shard has failed (see :meth:`WriteLog.sync`).
        """
        if self.log is not None:
            self.log.sync_appended()

    def close(self, release_lock: bool = True) -> None:
        """Make the log durable and close it (see :meth:`WriteLog.close`)."""
        if self.log is not None:
            self.log.close(release_lock)


def replay(
    server: ParameterServer, write_log: WriteLog, progress: RecoveryProgress, total: int
) -> int:
    """Apply every logged request after the log's base checkpoint to ``server``; returns the count.

    Call before a log is attached to ``server`` (replay is not logged again). ``progress``
    hears each record applied, of ``total`` (the log's records, as verified).
    """
    count = 0
    progress.replayed(0, total)
    for payload in write_log.replay():
        record = pb.LogRecord.FromString(payload)
        entry = record.WhichOneof("entry")
        if entry == "create_table":
            try:
                server.create_table(TableSpec.from_proto(record.create_table.spec))
            except TableExistsError:  # refused when it was first applied, too
                pass
        elif entry == "push":
            server.push_batch(
                [(r.table, r.ids, r.grads, r.request_id) for r in record.push.requests]
            )
        elif entry == "assign":
            a = record.assign
            server.assign(a.table, a.ids, a.values, a.state, a.request_id, a.versions)
        elif entry == "step":
            server.steps.replay(record.step)
        elif entry == "replica_released":
            server.steps.replicas.release(record.replica_released.job)
        count += 1
        progress.replayed(count, total)
    log.info("replayed %d logged requests from %s", count, write_log.directory)
    return count
