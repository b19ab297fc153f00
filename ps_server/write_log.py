"""WriteLog: a shard's write-ahead log, in numbered segment files with group commit.

Files ``<dir>/shard-S-of-N.<segment>.wal``; each record, written with one
``writev``, is a 16-byte header (``EMW2``, the payload length and the
payload's CRC-32 as uint32, then the CRC-32 of those 12 bytes), the payload (a
serialised ``LogRecord``) and the trailer ``EMWE``. The header's own CRC makes
the length trustworthy; the trailer means a whole record never ends in zeros. :meth:`WriteLog.append`
hands a record to the OS and returns a ticket; :meth:`WriteLog.sync` makes it
durable. With fsync ``always`` the caller syncs before acknowledging, and one
fsync covers every record appended before it (group commit); with
``interval`` a background thread fsyncs every ``interval_s`` (a process crash
loses nothing, a machine crash at most that interval).

Fail closed. A failed write or fsync trips the shard's :class:`ShardFault`:
the record being written is cut off again, nothing more is appended, and no
request is acknowledged from then on (the shard reports unhealthy). One
process owns a shard's log: :meth:`claim` takes ``shard-S.lock`` (an
``flock``, released when its holder dies) and refuses a directory that holds
logs or a checkpoint base of another shard count.

A checkpoint :meth:`rotate`\\s to a new segment under its write pause and,
once durable, :meth:`commit_base` records it in ``shard-S-of-N.base.json``
and deletes the segments it covers. Replay reads the segments from the base
on. Only a torn last record (see :func:`_is_torn_tail`) is cut off, with a
warning; any other damage stops the start, naming the file and byte offset.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import socket
import struct
import threading
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from ember.ps_server.durable_files import fsync_directory, write_durably
from ember.ps_server.errors import (
    DurableFileCorruptError,
    ShardFailedError,
    TopologyMismatchError,
    WriteLogLockedError,
)
from ember.ps_server.proto_wire import Buffer
from ember.ps_server.shard_fault import ShardFault

log = logging.getLogger(__name__)

MAGIC = b"EMW2"
OLD_MAGIC = b"EMWL"  # the first format: no header CRC, no trailer
TRAILER = b"EMWE"
_HEADER = struct.Struct("<4sIII")  # magic, payload length, payload CRC-32, CRC-32 of the first 12
_FRAMING = _HEADER.size + len(TRAILER)
FSYNC_POLICIES = ("always", "interval")
_FILE_OF_SHARD = re.compile(r"^shard-(\d+)-of-(\d+)\.(?:\d{8}\.wal|base\.json)$")
_BLOCK = 4096  # a crash leaves whole file blocks unwritten: they read back as zeros
_MAX_WRITEV_PARTS = 512


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
        self._prefix = f"shard-{shard}-of-{num_shards}"
        self._pattern = re.compile(rf"^{re.escape(self._prefix)}\.(\d{{8}})\.wal$")
        directory.mkdir(parents=True, exist_ok=True)
        self._append_lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._appended = 0  # bytes handed to the OS, over all segments
        self._synced = 0  # bytes known durable
        self._fd: int | None = None
        self._fsync_failed = False  # after a failed fsync, another proves nothing: none more
        self._segment = 0
        self._segment_bytes = 0
        self._lock_file = None
        self._closed = threading.Event()
        self._syncer: threading.Thread | None = None
        self._interval_s = interval_s

    @property
    def base_path(self) -> Path:
        """Where the last committed checkpoint of this shard is recorded."""
        return self.directory / f"{self._prefix}.base.json"

    def claim(self) -> None:
        """Become the one process that reads and writes this shard's log (idempotent).

        Raises:
            WriteLogLockedError: a live process holds it (its pid and host are named).
            TopologyMismatchError: the directory holds logs or a base of another shard count.
        """
        if self._lock_file is not None:
            return
        path = self.directory / f"shard-{self._shard}.lock"
        handle = open(path, "a+")  # noqa: SIM115 - held until close()
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                handle.close()
                raise
            handle.seek(0)
            holder = handle.read().strip() or "an unknown process"
            handle.close()
            raise WriteLogLockedError(
                f"the write-ahead log of shard {self._shard} in {self.directory} is in use by "
                f"{holder}; one shard process per log (stop the other one first)"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on host {socket.gethostname()}\n")
        handle.flush()
        self._lock_file = handle
        try:
            self._check_topology()
        except TopologyMismatchError:
            self._release_lock()
            raise

    def _check_topology(self) -> None:
        others = sorted(
            entry.name
            for entry in self.directory.iterdir()
            if (match := _FILE_OF_SHARD.match(entry.name))
            and int(match.group(2)) != self._num_shards
        )
        if others:
            raise TopologyMismatchError(
                f"{self.directory} holds the write-ahead log of another shard count "
                f"({', '.join(others[:4])}{', ...' if len(others) > 4 else ''}), and this is "
                f"shard {self._shard} of {self._num_shards}: serving would lose those writes. "
                "To change the shard count: start the old shards on this log, take a checkpoint "
                "(ember checkpoint --dir D), stop them, move this directory aside, then start "
                "the new shards with --restore D and an empty --wal directory"
            )

    def base(self) -> tuple[Path | None, int]:
        """``(checkpoint directory, first segment after it)``; ``(None, 1)`` without one."""
        if not self.base_path.exists():
            return None, 1
        try:
            record = json.loads(self.base_path.read_bytes())
            return Path(record["checkpoint"]), int(record["segment"])
        except (ValueError, KeyError, TypeError) as error:
            raise DurableFileCorruptError(f"{self.base_path}: unreadable ({error})") from error

    def segments(self) -> list[int]:
        """Numbers of the segment files present, ascending."""
        return sorted(
            int(match.group(1))
            for entry in self.directory.iterdir()
            if (match := self._pattern.match(entry.name))
        )

    def replay(self) -> Iterator[bytes]:
        """Every record payload after the base checkpoint, in order (claims the log first).

        A torn last record is cut off the file, with a warning.

        Raises:
            DurableFileCorruptError: a segment is missing, or a record fails its
                checks anywhere but as a torn tail of the last segment.
        """
        self.claim()
        _, first = self.base()
        segments = [n for n in self.segments() if n >= first]
        if segments and segments[0] != first:
            raise DurableFileCorruptError(
                f"{self._segment_path(first)}: missing (the log continues at segment "
                f"{segments[0]}); records in between are lost"
            )
        for position, number in enumerate(segments):
            if number != first + position:
                raise DurableFileCorruptError(f"{self._segment_path(first + position)}: missing")
            yield from self._read_segment(number, last=position == len(segments) - 1)

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
        header = memoryview(_header(length, crc))
        with self._append_lock:
            self.fault.check()
            start = self._segment_bytes
            try:
                _write_all(self._fd, [header, *parts, memoryview(TRAILER)])
            except OSError as error:
                self._cut_back(start)
                self._fail(
                    f"writing a record to the write-ahead log {self._segment_path(self._segment)} "
                    f"at byte {start} failed ({error}). No write is acknowledged from now on. "
                    "Fix the disk (free space), then restart the shard: it recovers every "
                    "acknowledged write from the log"
                )
            self._segment_bytes += _FRAMING + length
            self._appended += _FRAMING + length
            return self._appended

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
                self._fail(self._fsync_failure(error), fsync_failed=True)
            self._synced = self._appended
            new_fd = self._open_segment(self._segment + 1)
            old_fd, self._fd = self._fd, new_fd
            self._segment, self._segment_bytes = self._segment + 1, 0
            _close_quietly(old_fd, self._segment_path(self._segment - 1))
            return self._segment

    def commit_base(self, checkpoint: Path, segment: int) -> None:
        """Record ``checkpoint`` (covering segments before ``segment``) and delete those."""
        write_durably(
            self.base_path,
            json.dumps({"checkpoint": str(checkpoint), "segment": segment}).encode(),
        )
        for number in self.segments():
            if number < segment:
                self._segment_path(number).unlink()
        fsync_directory(self.directory)

    def close(self) -> None:
        """Make everything appended durable (unless the log failed), stop, release the lock."""
        self._closed.set()
        if self._syncer is not None:
            self._syncer.join()
        with self._sync_lock, self._append_lock:
            if self._fd is not None:
                if not self._fsync_failed:
                    try:
                        os.fsync(self._fd)
                    except OSError as error:
                        self.fault.trip(self._fsync_failure(error))
                fd, self._fd = self._fd, None
                _close_quietly(fd, self._segment_path(self._segment))
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()  # closing drops the flock
            self._lock_file = None

    def _open_segment(self, number: int) -> int:
        """Create segment ``number`` durably (a new, empty file); returns its descriptor."""
        path = self._segment_path(number)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        try:
            fsync_directory(self.directory)
        except OSError:
            os.close(fd)
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
        try:
            os.fsync(handle)
        except OSError as error:
            self._fail(self._fsync_failure(error), fsync_failed=True)
        self._synced = max(self._synced, target)

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

    def _fsync_failure(self, error: OSError) -> str:
        return (
            f"fsync of the write-ahead log {self._segment_path(self._segment)} failed ({error}): "
            f"records after byte {self._synced} of the log may not be durable. No write is "
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

    def _segment_path(self, number: int) -> Path:
        return self.directory / f"{self._prefix}.{number:08d}.wal"

    def _read_segment(self, number: int, last: bool) -> Iterator[bytes]:
        path = self._segment_path(number)
        data = path.read_bytes()
        if data.startswith(OLD_MAGIC):
            raise DurableFileCorruptError(
                f"{path}: written by an earlier Ember in the previous log format ({OLD_MAGIC!r}); "
                "replay it with that version, take a checkpoint, and start this version with "
                "--restore and an empty --wal directory"
            )
        offset = 0
        while offset < len(data):
            problem = _record_problem(data, offset)
            if problem is None:
                _, length, _, _ = _HEADER.unpack_from(data, offset)
                yield data[offset + _HEADER.size : offset + _HEADER.size + length]
                offset += _FRAMING + length
                continue
            intact = _next_intact_record(data, offset + 1)
            if last and _is_torn_tail(data, offset):
                log.warning(
                    "%s: torn last record at byte %d (%s) ignored; the log is cut there",
                    path, offset, problem,
                )  # fmt: skip
                with open(path, "r+b") as handle:
                    handle.truncate(offset)
                    os.fsync(handle.fileno())
                return
            after = (
                f"an intact record follows at byte {intact}"
                if intact is not None
                else "it is not what a crash mid-append leaves"
            )
            raise DurableFileCorruptError(
                f"{path}: record at byte {offset} is damaged ({problem}), and {after}: the log "
                "is corrupt, so the shard will not start. Restore the log file from a backup, or "
                f"accept losing this record and every later one of this shard (truncate the "
                f"file to {offset} bytes and delete later segments), or start from a checkpoint "
                "with an empty --wal directory"
            )


def _close_quietly(fd: int, path: Path) -> None:
    """Close a segment whose records are already fsynced (a close error loses nothing)."""
    try:
        os.close(fd)
    except OSError as error:
        log.error("closing %s: %s", path, error)


def _write_all(fd: int, parts: list[memoryview]) -> None:
    """``writev`` every byte of ``parts`` to ``fd`` (retrying short writes)."""
    pending = [part for part in parts if part.nbytes]
    while pending:
        written = os.writev(fd, pending[:_MAX_WRITEV_PARTS])
        while pending and written >= pending[0].nbytes:
            written -= pending[0].nbytes
            pending.pop(0)
        if written:
            pending[0] = pending[0][written:]


def _header(length: int, crc: int) -> bytes:
    head = struct.pack("<4sII", MAGIC, length, crc)
    return head + struct.pack("<I", zlib.crc32(head))


def _record_problem(data: bytes, offset: int) -> str | None:
    """Why the record at ``offset`` is not whole and intact, or None."""
    if len(data) - offset < _HEADER.size:
        return f"{len(data) - offset} bytes left, a header needs {_HEADER.size}"
    magic, length, crc, header_crc = _HEADER.unpack_from(data, offset)
    actual = zlib.crc32(memoryview(data)[offset : offset + 12])
    if actual != header_crc:
        return f"header CRC-32 {actual:#010x} does not match the recorded {header_crc:#010x}"
    if magic != MAGIC:
        return f"magic {magic!r}, expected {MAGIC!r}"
    end = offset + _FRAMING + length
    if end > len(data):
        return f"{length}-byte payload runs past the end of the file"
    actual = zlib.crc32(memoryview(data)[offset + _HEADER.size : end - len(TRAILER)])
    if actual != crc:
        return f"CRC-32 {actual:#010x} does not match the recorded {crc:#010x}"
    if data[end - len(TRAILER) : end] != TRAILER:
        return f"trailer {bytes(data[end - len(TRAILER) : end])!r}, expected {TRAILER!r}"
    return None


def _next_intact_record(data: bytes, start: int) -> int | None:
    """Offset of the first whole, intact record at or after ``start``, if any."""
    position = data.find(MAGIC, start)
    while position >= 0:
        if _record_problem(data, position) is None:
            return position
        position = data.find(MAGIC, position + 1)
    return None


def _is_torn_tail(data: bytes, offset: int) -> bool:
    """Whether the damaged record at ``offset``, the last in the log, is what a crash
    mid-append leaves: never something a flipped bit can make of a whole record.

    An append is one write that extends the file. A crash leaves its first
    bytes (the file ends early: fewer bytes than a header, or than the length
    its intact header gives), or the file extended over blocks that were never
    written and read back as zeros: a header whose blocks (all but a first one
    it shares with the previous record) are zeros to the end of the file, or a
    record whose last block is zeros (a whole record ends with the trailer). Bytes after the
    damaged record that hold an intact record make it corruption.
    """
    if len(data) - offset < _HEADER.size:
        return True
    _, length, _, header_crc = _HEADER.unpack_from(data, offset)
    if zlib.crc32(memoryview(data)[offset : offset + 12]) != header_crc:
        # Unwritten from the header's last block on (the header may straddle a block whose
        # first part was written with the previous record).
        boundary = -(-offset // _BLOCK) * _BLOCK
        start = boundary if boundary < offset + _HEADER.size else offset
        return data[start:] == bytes(len(data) - start)
    end = offset + _FRAMING + length
    if end > len(data):
        return True  # the intact header's length says it was cut short
    if _next_intact_record(data, end) is not None:
        return False
    last_block = max(offset + _HEADER.size, (end - 1) // _BLOCK * _BLOCK)
    return data[last_block:end] == bytes(end - last_block)
