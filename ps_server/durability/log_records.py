"""Write-ahead log records: their framing, reading them back, and telling a torn last record
from corruption.

A record is a 16-byte header (``EMW2``, the payload length and the payload's
CRC-32 as uint32, then the CRC-32 of those 12 bytes), the payload and the
trailer ``EMWE``. The header's own CRC makes the length trustworthy; the
trailer means a whole record never ends in zeros.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

from ember.ps_server.durability.durable_files import fsync_path
from ember.ps_server.errors import DurableFileCorruptError, DurableStateError

log = logging.getLogger(__name__)

MAGIC = b"EMW2"
OLD_MAGIC = b"EMWL"  # the first format: no header CRC, no trailer
TRAILER = b"EMWE"
HEADER = struct.Struct("<4sIII")  # magic, payload length, payload CRC-32, CRC-32 of the first 12
FRAMING = HEADER.size + len(TRAILER)
BLOCK = 4096  # a crash leaves whole file blocks unwritten: they read back as zeros


def segment_records(path: Path, last: bool) -> Iterator[bytes]:
    """The payloads of a segment file's records, in order. In the ``last`` segment a torn
    last record (see :func:`is_torn_tail`) is cut off the file, with a warning.

    Raises:
        DurableFileCorruptError: any other damage, naming the file and byte offset.
        DurableStateError: the file cannot be fsynced before it is read.
    """
    fsync_before_replay(path)
    data = path.read_bytes()
    if data.startswith(OLD_MAGIC):
        raise DurableFileCorruptError(
            f"{path}: written by an earlier Ember in the previous log format ({OLD_MAGIC!r}); "
            "replay it with that version, take a checkpoint, and start this version with "
            "--restore and an empty --wal directory"
        )
    offset = 0
    while offset < len(data):
        problem = record_problem(data, offset)
        if problem is None:
            _, length, _, _ = HEADER.unpack_from(data, offset)
            yield data[offset + HEADER.size : offset + HEADER.size + length]
            offset += FRAMING + length
            continue
        intact = next_intact_record(data, offset + 1)
        if last and is_torn_tail(data, offset):
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


def fsync_before_replay(path: Path) -> None:
    """fsync ``path`` (a segment, or the log's directory) before it is replayed: what the
    page cache holds may not be on the disk (its writer died before its fsync), and a
    replayed record is built on (retries of it are acknowledged as duplicates).

    Raises:
        DurableStateError: the fsync failed.
    """
    try:
        fsync_path(path)
    except OSError as error:
        raise DurableStateError(
            f"{path}: cannot make the write-ahead log durable before replaying it ({error}); "
            "fix the disk, then restart the shard"
        ) from error


def header(length: int, crc: int) -> bytes:
    """The 16-byte header of a record whose payload has ``length`` bytes and CRC-32 ``crc``."""
    head = struct.pack("<4sII", MAGIC, length, crc)
    return head + struct.pack("<I", zlib.crc32(head))


def record_problem(data: bytes, offset: int) -> str | None:
    """Why the record at ``offset`` is not whole and intact, or None."""
    if len(data) - offset < HEADER.size:
        return f"{len(data) - offset} bytes left, a header needs {HEADER.size}"
    magic, length, crc, header_crc = HEADER.unpack_from(data, offset)
    actual = zlib.crc32(memoryview(data)[offset : offset + 12])
    if actual != header_crc:
        return f"header CRC-32 {actual:#010x} does not match the recorded {header_crc:#010x}"
    if magic != MAGIC:
        return f"magic {magic!r}, expected {MAGIC!r}"
    end = offset + FRAMING + length
    if end > len(data):
        return f"{length}-byte payload runs past the end of the file"
    actual = zlib.crc32(memoryview(data)[offset + HEADER.size : end - len(TRAILER)])
    if actual != crc:
        return f"CRC-32 {actual:#010x} does not match the recorded {crc:#010x}"
    if data[end - len(TRAILER) : end] != TRAILER:
        return f"trailer {bytes(data[end - len(TRAILER) : end])!r}, expected {TRAILER!r}"
    return None


def next_intact_record(data: bytes, start: int) -> int | None:
    """Offset of the first whole, intact record at or after ``start``, if any."""
    position = data.find(MAGIC, start)
    while position >= 0:
        if record_problem(data, position) is None:
            return position
        position = data.find(MAGIC, position + 1)
    return None


def is_torn_tail(data: bytes, offset: int) -> bool:
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
    if len(data) - offset < HEADER.size:
        return True
    _, length, _, header_crc = HEADER.unpack_from(data, offset)
    if zlib.crc32(memoryview(data)[offset : offset + 12]) != header_crc:
        # Unwritten from the header's last block on (the header may straddle a block whose
        # first part was written with the previous record).
        boundary = -(-offset // BLOCK) * BLOCK
        start = boundary if boundary < offset + HEADER.size else offset
        return data[start:] == bytes(len(data) - start)
    end = offset + FRAMING + length
    if end > len(data):
        return True  # the intact header's length says it was cut short
    if next_intact_record(data, end) is not None:
        return False
    last_block = max(offset + HEADER.size, (end - 1) // BLOCK * BLOCK)
    return data[last_block:end] == bytes(end - last_block)
