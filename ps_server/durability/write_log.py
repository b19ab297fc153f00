"""WriteLog: a shard's write-ahead log, in numbered segment files with group commit.

Files ``<dir>/shard-S-of-N.<segment>.wal`` of records (a serialised
``LogRecord`` each, framed as :mod:`log_records` says, written with one
``writev``; the files' layout: :mod:`log_segments`). :meth:`WriteLog.append`
hands a record to the OS and returns a ticket; :meth:`WriteLog.sync` makes it
durable. With fsync ``always`` the caller syncs before acknowledging, and one
fsync covers every record appended before it (group commit); with
``interval`` a background thread fsyncs every ``interval_s`` (a process crash
loses nothing, a machine crash at most that interval).

Fail closed. A failed write or fsync trips the shard's :class:`ShardFault`:
the record being written is cut off again, nothing more is appended, and no
request is acknowledged from then on (the shard reports unhealthy). One
process owns a shard's log: :meth:`claim` locks it and refuses a directory
that holds logs or a checkpoint base of another shard count (see
:mod:`log_ownership`).

A checkpoint :meth:`rotate`\\s to a new segment under its write pause and,
once durable, :meth:`commit_base` records it in ``shard-S-of-N.base.json``
and deletes the segments it covers. :attr:`bytes_since_base` is the size of
the log a restart replays; ``on_append`` hears it after every record (what
automatic checkpoints wake on). Replay reads the segments from the base
on. Only a torn last record (see :func:`log_records.is_torn_tail`) is cut off, with a
warning; any other damage stops the start, naming the file and byte offset.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ember.ps_server.durability.durable_files import (
    fsync_directory,
    make_directory_durably,
    write_all,
)
from ember.ps_server.durability.log_ownership import check_shard_count, lock_shard_log
from ember.ps_server.durability.log_records import FRAMING, TRAILER, fsync_before_replay, header
from ember.ps_server.durability.log_segments import LogSegments
from ember.ps_server.durability.shard_fault import ShardFault
from ember.ps_server.errors import ShardFailedError, TopologyMismatchError
from ember.ps_server.wire.proto_wire import Buffer

log = logging.getLogger(__name__)

FSYNC_POLICIES = ("always", "interval")


class WriteLog:
    """The write-ahead log of shard ``shard`` of ``num_shards`` in ``directory``.

    Args:
        directory: where the segments live (shared by the shards of a host is fine).
        shard, num_shards: whose log this is (part of every file name).
        fsync: ``always`` (durable before acknowledgement) or ``interval``.
        interval_s: fsync period under ``interval``.
        fault: the shard's latch, tripped by a failed write or fsync (a new one if None).
    """

    def __init__(
        self,
        directory: Path,
        shard: int,
        num_shards: int,
        fsync: str = "interval",
        interval_s: float = 0.05,
        fault: ShardFault | None = None,
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"wal fsync must be one of {FSYNC_POLICIES}, got {fsync!r}")
        if not interval_s > 0:
            raise ValueError(f"wal fsync interval must be > 0 seconds, got {interval_s}")
        self.directory = directory
        self.fsync = fsync
        self.fault = fault or ShardFault()
        self._shard, self._num_shards = shard, num_shards
        self.files = LogSegments(directory, shard, num_shards)
        make_directory_durably(directory)
        self._append_lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._appended = 0  # bytes handed to the OS, over all segments
        self._synced = 0  # bytes known durable
        self._fd: int | None = None
        self._fsync_failed = False  # after a failed fsync, another proves nothing: none more
        # Told each fsync's seconds (the shard's metrics).
        self.on_fsync: Callable[[float], None] | None = None
        # Told the bytes a restart would replay after each record (automatic checkpoints).
        self.on_append: Callable[[int], None] | None = None
        self._since_base = 0
        self._segment = 0
        self._segment_bytes = 0
        self._lock_file = None
        self._closed = threading.Event()
        self._syncer: threading.Thread | None = None
        self._interval_s = interval_s

    def claim(self) -> None:
        """Become the one process that reads and writes this shard's log (idempotent).

        Raises:
            WriteLogLockedError: a live process holds it (its pid and host are named).
            TopologyMismatchError: the directory holds logs or a base of another shard count.
        """
        if self._lock_file is not None:
            return
        self._lock_file = lock_shard_log(self.directory, self._shard)
        try:
            check_shard_count(self.directory, self._shard, self._num_shards)
        except TopologyMismatchError:
            self._release_lock()
            raise

    def base(self) -> tuple[Path | None, int]:
        """``(checkpoint directory, first segment after it)``; ``(None, 1)`` without one."""
        return self.files.base()

    def segments(self) -> list[int]:
        """Numbers of the segment files present, ascending."""
        return self.files.numbers()

    def replay(self) -> Iterator[bytes]:
        """Every record payload after the base checkpoint, in order (claims the log first).

        A torn last record is cut off the file, with a warning. The directory and each
        segment are fsynced before they are read (:func:`fsync_before_replay`).

        Raises:
            DurableFileCorruptError: a segment is missing, or a record fails its
                checks anywhere but as a torn tail of the last segment.
            DurableStateError: a segment or the directory cannot be fsynced.
        """
        self.claim()
        _, first = self.base()
        fsync_before_replay(self.directory)
        yield from self.files.records(first)

    def verify(self) -> int:
        """Check every record after the base (cutting a torn tail) without applying; returns
        how many there are. Raises as :meth:`replay` does."""
        return sum(1 for _ in self.replay())

    def open(self) -> None:
        """Start appending, in a segment after every existing one (call after :meth:`replay`)."""
        self.claim()
        _, first = self.base()
        self._segment = max([first - 1, *self.segments()]) + 1
        self._fd, self._segment_bytes = self._open_segment(self._segment), 0
        self._since_base = self.files.bytes_from(first)
        if self.fsync == "interval":
            self._syncer = threading.Thread(
                target=self._sync_periodically, name="ember-wal-sync", daemon=True
            )
            self._syncer.start()

    def append(self, payload: bytes | Sequence[Buffer]) -> int:
        """Write one record (to the OS); returns the ticket to :meth:`sync` on.

        ``payload`` may come in parts (written in order, never joined).

        Raises:
            ShardFailedError: this write failed (it is cut off again), or an earlier one did.
        """
        parts = [
            memoryview(part).cast("B")
            for part in ([payload] if isinstance(payload, bytes) else payload)
        ]
        crc, length = 0, 0
        for part in parts:
            crc = zlib.crc32(part, crc)
            length += part.nbytes
        head = memoryview(header(length, crc))
        with self._append_lock:
            self.fault.check()
            start = self._segment_bytes
            try:
                write_all(self._fd, [head, *parts, memoryview(TRAILER)])
            except OSError as error:
                self._cut_back(start)
                self._fail(
                    f"writing a record to the write-ahead log {self.files.path(self._segment)} "
                    f"at byte {start} failed ({error}). No write is acknowledged from now on. "
                    "Fix the disk (free space), then restart the shard: it recovers every "
                    "acknowledged write from the log"
                )
            self._segment_bytes += FRAMING + length
            self._appended += FRAMING + length
            self._since_base += FRAMING + length
            ticket, since_base = self._appended, self._since_base
        if self.on_append is not None:
            self.on_append(since_base)
        return ticket

    def sync(self, ticket: int) -> None:
        """Return once the record of ``ticket`` is durable (under ``interval``, at once);
        the caller acknowledges it then.

        Raises:
            ShardFailedError: the shard has failed (this log's write or fsync, or anything
                else): nothing is acknowledged after a failure.
        """
        self.fault.check()
        if self._synced >= ticket or self.fsync != "always":
            return
        with self._sync_lock:
            if self._synced < ticket:  # else another request's fsync covered this one
                self._fsync_appended()
        self.fault.check()

    def sync_appended(self) -> None:
        """Return once every record appended so far is durable (see :meth:`sync`)."""
        with self._append_lock:
            ticket = self._appended
        self.sync(ticket)

    def rotate(self) -> int:
        """Close the current segment durably and start the next; returns its number.

        The current segment is fsynced (a failure stops the log: see :meth:`sync`)
        and the next one created before anything is switched, so a next segment that
        cannot be created fails only this rotation (and its checkpoint): appends go
        on in the current segment.

        Raises:
            ShardFailedError: the fsync failed, or the log failed earlier.
            OSError: the next segment could not be created.
        """
        with self._sync_lock, self._append_lock:
            self.fault.check()
            try:
                os.fsync(self._fd)
            except OSError as error:
                self._fail(self._cut_unsynced(error), fsync_failed=True)
            self._synced = self._appended
            new_fd = self._open_segment(self._segment + 1)
            old_fd, self._fd = self._fd, new_fd
            self._segment, self._segment_bytes = self._segment + 1, 0
            _close_quietly(old_fd, self.files.path(self._segment - 1))
            return self._segment

    @property
    def bytes_since_base(self) -> int:
        """Bytes of the segments after the base checkpoint: what a restart replays."""
        return self._since_base

    def commit_base(self, checkpoint: Path, segment: int) -> None:
        """Record ``checkpoint`` (covering segments before ``segment``) and delete those."""
        self.record_base(checkpoint, segment)
        self.drop_segments_before(segment)

    def record_base(self, checkpoint: Path, segment: int) -> None:
        """Write ``checkpoint`` and the first segment after it durably into the base file:
        from now on a restart restores it and replays from ``segment``."""
        self.files.write_base(checkpoint, segment)
        with self._append_lock:  # no record half written: the files' sizes are exact
            self._since_base = self.files.bytes_from(segment)

    def drop_segments_before(self, segment: int) -> None:
        """Delete the segments a recorded base covers (a restart skips them anyway)."""
        self.files.drop_before(segment)

    def close(self, release_lock: bool = True) -> None:
        """Make everything appended durable (unless the log failed) and stop; release the
        lock (``release_lock`` False: a process that stays up, refusing, keeps it, so that no
        other process takes the log meanwhile; closing again releases it)."""
        self._closed.set()
        if self._syncer is not None:
            self._syncer.join()
        with self._sync_lock, self._append_lock:
            if self._fd is not None:
                if not self._fsync_failed:
                    try:
                        os.fsync(self._fd)
                        self._synced = self._appended  # a request waiting to sync is covered
                    except OSError as error:
                        self._fsync_failed = True
                        self.fault.trip(self._cut_unsynced(error))
                fd, self._fd = self._fd, None
                _close_quietly(fd, self.files.path(self._segment))
        if release_lock:
            self._release_lock()

    def _release_lock(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()  # closing drops the flock
            self._lock_file = None

    def _open_segment(self, number: int) -> int:
        """Create segment ``number`` durably (a new, empty file); returns its descriptor."""
        path = self.files.path(number)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        try:
            fsync_directory(self.directory)
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)  # left behind, it would block every later rotation
            raise
        return fd

    def _fsync_appended(self) -> None:
        """fsync everything appended so far (caller holds the sync lock).

        Runs after a fault of the shard's, even a failed append (acknowledged records
        must still become durable), but never again after an fsync failed.
        """
        if self._fsync_failed:
            self.fault.check()
        with self._append_lock:
            target, handle = self._appended, self._fd
        if handle is None:  # closed (its close fsynced what it could) while a request waited
            self.fault.check()
            raise ShardFailedError("the write-ahead log is closed: the shard is stopping")
        start = time.perf_counter()
        try:
            os.fsync(handle)
        except OSError as error:
            with self._append_lock:
                reason = self._cut_unsynced(error)
            self._fail(reason, fsync_failed=True)
        self._synced = max(self._synced, target)
        if self.on_fsync is not None:
            try:
                self.on_fsync(time.perf_counter() - start)
            except Exception:
                log.exception("write-ahead log: the fsync observer failed")

    def _sync_periodically(self) -> None:
        while not self._closed.wait(self._interval_s):
            try:
                with self._sync_lock:
                    if self._synced < self._appended:
                        self._fsync_appended()
            except Exception as error:  # noqa: BLE001 - a syncer must never die silently
                self._fsync_failed = True
                self.fault.trip(f"write-ahead log fsync thread stopped: {error}")
                return

    def _cut_unsynced(self, error: OSError) -> str:
        """After the failed fsync ``error``, cut off the records no fsync covered (caller
        holds the append lock; best effort) and return the failure's reason. The kernel may
        never write those records, yet a restart would replay them from its page cache and
        answer their retries as duplicates. Rotation fsyncs a segment before the next
        begins, so they all lie in the current one."""
        self._cut_back(self._segment_bytes - (self._appended - self._synced))
        return (
            f"fsync of the write-ahead log {self.files.path(self._segment)} failed ({error}): "
            f"the records after byte {self._synced} of the log, which no fsync covered, are cut "
            "off it (under --wal-fsync always none of them was acknowledged). No write is "
            "acknowledged from now on. Check the disk, then restart the shard"
        )

    def _fail(self, reason: str, fsync_failed: bool = False) -> None:
        """The log itself failed: stop the shard (no more appends); after a failed fsync
        stop fsyncing too."""
        self._fsync_failed = self._fsync_failed or fsync_failed
        self.fault.trip(reason)
        raise ShardFailedError(f"this shard stopped serving: {self.fault.reason}")

    def _cut_back(self, size: int) -> None:
        """Best effort: remove a partly written record, so the log ends with a whole one."""
        try:
            os.ftruncate(self._fd, size)
        except OSError as error:
            log.error("cannot cut the partial record off %s: %s", self.directory, error)


def _close_quietly(fd: int, path: Path) -> None:
    """Close a segment whose records are already fsynced (a close error loses nothing)."""
    try:
        os.close(fd)
    except OSError as error:
        log.error("closing %s: %s", path, error)
