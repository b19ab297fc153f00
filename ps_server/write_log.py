"""WriteLog: a shard's write-ahead log, in numbered segment files with group commit.

Files ``<dir>/shard-S-of-N.<segment>.wal``; each record is ``EMWL``, the
payload length (uint32), the payload's CRC-32 (uint32) and the payload (a
serialised ``LogRecord``). :meth:`WriteLog.append` hands a record to the OS
and returns a ticket; :meth:`WriteLog.sync` makes it durable. With fsync
``always`` the caller syncs before acknowledging, and one fsync covers every
record appended before it (group commit); with ``interval`` a background
thread fsyncs every ``interval_s`` (a process crash loses nothing, a machine
crash at most that interval).

A checkpoint :meth:`rotate`\\s to a new segment under its write pause and,
once durable, :meth:`commit_base` records it in ``shard-S-of-N.base.json``
and deletes the segments it covers. Replay reads the segments from the base
on: a torn last record (a crash mid-write) is cut off with a warning; a bad
record anywhere else is refused, naming the file, offset and checksums.
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
import threading
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from ember.ps_server.durable_files import fsync_directory, write_durably
from ember.ps_server.errors import DurableFileCorruptError
from ember.ps_server.wire_codec import Buffer

log = logging.getLogger(__name__)

MAGIC = b"EMWL"
_HEADER = struct.Struct("<4sII")
FSYNC_POLICIES = ("always", "interval")


class WriteLog:
    """The write-ahead log of shard ``shard`` of ``num_shards`` in ``directory``.

    Args:
        directory: where the segments live (shared by the shards of a host is fine).
        shard, num_shards: whose log this is (part of every file name).
        fsync: ``always`` (durable before acknowledgement) or ``interval``.
        interval_s: fsync period under ``interval``.
    """

    def __init__(
        self,
        directory: Path,
        shard: int,
        num_shards: int,
        fsync: str = "interval",
        interval_s: float = 0.05,
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"wal fsync must be one of {FSYNC_POLICIES}, got {fsync!r}")
        if not interval_s > 0:
            raise ValueError(f"wal fsync interval must be > 0 seconds, got {interval_s}")
        self.directory = directory
        self.fsync = fsync
        self._prefix = f"shard-{shard}-of-{num_shards}"
        self._pattern = re.compile(rf"^{re.escape(self._prefix)}\.(\d{{8}})\.wal$")
        directory.mkdir(parents=True, exist_ok=True)
        self._append_lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._appended = 0  # bytes handed to the OS, over all segments
        self._synced = 0  # bytes known durable
        self._file = None
        self._segment = 0
        self._closed = threading.Event()
        self._syncer: threading.Thread | None = None
        self._interval_s = interval_s

    @property
    def base_path(self) -> Path:
        """Where the last committed checkpoint of this shard is recorded."""
        return self.directory / f"{self._prefix}.base.json"

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
        """Every record payload after the base checkpoint, in order.

        Raises:
            DurableFileCorruptError: a segment is missing, or a record other
                than the very last fails its checks.
        """
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

    def open(self) -> None:
        """Start appending, in a segment after every existing one (call after :meth:`replay`)."""
        _, first = self.base()
        self._segment = max([first - 1, *self.segments()]) + 1
        self._file = open(self._segment_path(self._segment), "ab")  # noqa: SIM115
        fsync_directory(self.directory)
        if self.fsync == "interval":
            self._syncer = threading.Thread(
                target=self._sync_periodically, name="ember-wal-sync", daemon=True
            )
            self._syncer.start()

    def append(self, payload: bytes | Sequence[Buffer]) -> int:
        """Write one record (to the OS); returns the ticket to :meth:`sync` on.

        ``payload`` may come in parts (written in order, never joined).
        """
        parts = [
            memoryview(part).cast("B")
            for part in ([payload] if isinstance(payload, bytes) else payload)
        ]
        crc, length = 0, 0
        for part in parts:
            crc = zlib.crc32(part, crc)
            length += part.nbytes
        with self._append_lock:
            self._file.write(_HEADER.pack(MAGIC, length, crc))
            for part in parts:
                self._file.write(part)
            self._file.flush()
            self._appended += _HEADER.size + length
            return self._appended

    def sync(self, ticket: int) -> None:
        """Return once the record of ``ticket`` is durable (no-op under ``interval``)."""
        if self.fsync != "always" or self._synced >= ticket:
            return
        with self._sync_lock:
            if self._synced >= ticket:  # another request's fsync covered this one
                return
            with self._append_lock:
                target, handle = self._appended, self._file.fileno()
            os.fsync(handle)
            self._synced = max(self._synced, target)

    def rotate(self) -> int:
        """Close the current segment durably and start the next; returns its number."""
        with self._sync_lock, self._append_lock:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._synced = self._appended
            self._segment += 1
            self._file = open(self._segment_path(self._segment), "ab")  # noqa: SIM115
            fsync_directory(self.directory)
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
        """Make everything appended durable and stop."""
        self._closed.set()
        if self._syncer is not None:
            self._syncer.join()
        if self._file is not None:
            with self._append_lock:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()

    def _sync_periodically(self) -> None:
        while not self._closed.wait(self._interval_s):
            with self._sync_lock:
                with self._append_lock:
                    if self._synced >= self._appended:
                        continue
                    target, handle = self._appended, self._file.fileno()
                os.fsync(handle)
                self._synced = max(self._synced, target)

    def _segment_path(self, number: int) -> Path:
        return self.directory / f"{self._prefix}.{number:08d}.wal"

    def _read_segment(self, number: int, last: bool) -> Iterator[bytes]:
        path = self._segment_path(number)
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            problem = _record_problem(data, offset)
            if problem is None:
                _, length, _ = _HEADER.unpack_from(data, offset)
                yield data[offset + _HEADER.size : offset + _HEADER.size + length]
                offset += _HEADER.size + length
                continue
            if last and _is_tail(data, offset):
                log.warning(
                    "%s: torn last record at byte %d (%s) ignored; the log is cut there",
                    path, offset, problem,
                )  # fmt: skip
                with open(path, "r+b") as handle:
                    handle.truncate(offset)
                    os.fsync(handle.fileno())
                return
            raise DurableFileCorruptError(f"{path}: record at byte {offset}: {problem}")


def _record_problem(data: bytes, offset: int) -> str | None:
    """Why the record at ``offset`` is not whole and intact, or None."""
    if len(data) - offset < _HEADER.size:
        return f"{len(data) - offset} bytes left, a header needs {_HEADER.size}"
    magic, length, crc = _HEADER.unpack_from(data, offset)
    if magic != MAGIC:
        return f"magic {magic!r}, expected {MAGIC!r}"
    end = offset + _HEADER.size + length
    if end > len(data):
        return f"{length}-byte payload runs past the end of the file"
    actual = zlib.crc32(data[offset + _HEADER.size : end])
    if actual != crc:
        return f"CRC-32 {actual:#010x} does not match the recorded {crc:#010x}"
    return None


def _is_tail(data: bytes, offset: int) -> bool:
    """True when the bad record at ``offset`` is what a crash mid-append leaves at the end."""
    if len(data) - offset < _HEADER.size:
        return True
    magic, length, _ = _HEADER.unpack_from(data, offset)
    if magic != MAGIC:
        return not any(data[offset:])  # zeros the file system extended it with
    return offset + _HEADER.size + length >= len(data)
