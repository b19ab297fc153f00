"""Files that are either complete and checksummed or absent: write to a temp name, fsync, rename."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Self

from ember.ps_server.errors import DurableFileCorruptError

_READ_CHUNK = 1 << 22
_MAX_WRITEV_PARTS = 512  # under every platform's IOV_MAX


FLUSH_BYTES = 64 << 20
"""A writer makes every this many bytes durable as it goes: a large file streams to disk at
disk speed instead of piling up dirty pages that stall the end."""


class DurableWriter:
    """Writes ``path`` through ``path.tmp``; :meth:`commit` fsyncs and renames it into place.

    :meth:`write` hashes (sha256) and hands each buffer to a thread of its own
    that writes it, at most :data:`_QUEUED` buffers behind, so the caller
    prepares the next buffer while the disk takes this one; every :data:`FLUSH_BYTES` it
    ``fdatasync``\\s. Buffers handed to :meth:`write` must not change until
    :meth:`commit`. A write error is raised by the next :meth:`write` or by
    :meth:`commit`; leaving the ``with`` block without committing removes the
    temp file.
    """

    _QUEUED = 8

    def __init__(self, path: Path) -> None:
        self.path = path
        self.bytes = 0
        self._hash = hashlib.sha256()
        self._tmp = path.with_name(path.name + ".tmp")
        self._file = _created_afresh(self._tmp)
        self._queue: queue.Queue[memoryview | None] = queue.Queue(self._QUEUED)
        self._failure: BaseException | None = None
        self._written = 0  # bytes handed to the file by the writing thread
        self._flushing = (0, 0)  # the block on its way to the disk
        self._writer = threading.Thread(target=self._drain, name="ember-durable-write")
        self._writer.start()

    def write(self, data: bytes | memoryview) -> None:
        """Append ``data`` (handed to the writing thread; see the class docstring)."""
        self._raise_failure()
        view = memoryview(data)
        if not view.nbytes:
            return
        view = view.cast("B")
        self._hash.update(view)  # here, while the writing thread waits on the disk
        self._queue.put(view)
        self.bytes += view.nbytes

    @property
    def sha256(self) -> str:
        """Hex sha256 of what was written so far."""
        return self._hash.hexdigest()

    def commit(self) -> None:
        """Finish writing, fsync, rename into place and fsync the directory."""
        self._finish()
        self._raise_failure()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._tmp, self.path)
        fsync_directory(self.path.parent)

    def _drain(self) -> None:
        while (view := self._queue.get()) is not None:
            if self._failure is not None:
                continue  # keep taking buffers, so a waiting write() returns
            try:
                self._file.write(view)
                self._written += view.nbytes
                if self._written - self._flushing[1] >= FLUSH_BYTES:
                    self._file.flush()
                    block = (self._flushing[1], self._written)
                    _stream_out(self._file.fileno(), self._flushing, block)
                    self._flushing = block
            except BaseException as error:  # noqa: BLE001 - raised in the caller's thread
                self._failure = error

    def _finish(self) -> None:
        if self._writer.is_alive():
            self._queue.put(None)
            self._writer.join()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._finish()
        if not self._file.closed:
            self._file.close()
            self._tmp.unlink(missing_ok=True)


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """Linux's ``sync_file_range``, where libc has it."""
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return function


_SYNC_RANGE = _sync_file_range()
_WAIT_BEFORE, _WRITE, _WAIT_AFTER = 1, 2, 4


def _stream_out(fd: int, previous: tuple[int, int], block: tuple[int, int]) -> None:
    """Start writing the byte range ``block`` of ``fd`` to the disk, then wait for the
    ``previous`` one (one block in flight while the next is prepared). Without
    ``sync_file_range``, ``fdatasync``."""
    global _SYNC_RANGE
    for (start, end), flags in ((block, _WRITE), (previous, _WAIT_BEFORE | _WRITE | _WAIT_AFTER)):
        sync_range = _SYNC_RANGE  # one read: another writer may clear it
        if sync_range is None:
            os.fdatasync(fd)
            return
        if end > start and sync_range(fd, start, end - start, flags) != 0:
            error = ctypes.get_errno()
            if error in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ESPIPE):
                _SYNC_RANGE = None  # this filesystem has none: fdatasync from now on
                continue
            raise OSError(error, f"sync_file_range: {os.strerror(error)}")


def _created_afresh(path: Path) -> BinaryIO:
    """``path`` as a new file open for writing: whatever has that name (a temp file left by a
    crash, or a link someone planted to redirect the write) is removed first, and the file
    is created, never opened through a link (O_EXCL, O_NOFOLLOW)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(path, flags, 0o644), "wb")


def write_durably(path: Path, data: bytes) -> str:
    """Write ``data`` to ``path`` atomically and durably; returns its sha256."""
    with DurableWriter(path) as writer:
        writer.write(data)
        writer.commit()
        return writer.sha256


def write_all(fd: int, parts: list[memoryview]) -> None:
    """``writev`` every byte of ``parts`` to ``fd`` (retrying short writes); no fsync."""
    pending = [part for part in parts if part.nbytes]
    while pending:
        written = os.writev(fd, pending[:_MAX_WRITEV_PARTS])
        while pending and written >= pending[0].nbytes:
            written -= pending[0].nbytes
            pending.pop(0)
        if written:
            pending[0] = pending[0][written:]


def fsync_path(path: Path) -> None:
    """fsync the file or directory at ``path`` (through a descriptor of its own)."""
    handle = os.open(path, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def fsync_directory(directory: Path) -> None:
    """Make renames and creations in ``directory`` durable."""
    fsync_path(directory)


def make_directory_durably(directory: Path) -> None:
    """Create ``directory`` and any missing parents (as ``mkdir -p``), each one's entry made
    durable in its parent: files fsynced inside a directory a crash forgets are lost too."""
    missing = []
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for made in reversed(missing):
        made.mkdir(exist_ok=True)
        fsync_directory(made.parent)


def verify_file(path: Path, sha256: str, size: int | None = None, contents: bool = True) -> None:
    """Raise DurableFileCorruptError, naming the file and checksums, unless ``path`` matches
    (only its presence and size without ``contents``: the reader checks the sha256).

    Raises:
        DurableFileCorruptError: missing, of another size, or another sha256.
    """
    if not path.is_file():
        raise DurableFileCorruptError(f"{path}: missing (the checkpoint lists it)")
    actual_size = path.stat().st_size
    if size is not None and actual_size != size:
        raise DurableFileCorruptError(
            f"{path}: {actual_size} bytes, expected {size} (truncated or overwritten); "
            f"expected sha256 {sha256}"
        )
    if not contents:
        return
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        while chunk := source.read(_READ_CHUNK):
            digest.update(chunk)
    _check_digest(path, digest.hexdigest(), sha256)


def read_verified(path: Path, sha256: str, size: int) -> bytes:
    """The bytes of a small file, read once and returned only if they match its size and
    sha256 (what is checked is what is used).

    Raises:
        DurableFileCorruptError: missing, of another size, or another sha256.
    """
    verify_file(path, sha256, size, contents=False)
    data = path.read_bytes()
    _check_digest(path, hashlib.sha256(data).hexdigest(), sha256)
    return data


def _check_digest(path: Path, actual: str, expected: str) -> None:
    if actual != expected:
        raise DurableFileCorruptError(
            f"{path}: sha256 {actual} does not match the expected {expected}; the file is corrupt"
        )


class HashAhead:
    """Checks a file's sha256 on a thread of its own while the caller parses it (through a
    memory map): one pass over the disk instead of two, since the thread's large sequential
    reads run ahead and leave the pages in the cache for the parser. :meth:`finish` raises
    if it did not match, so whatever was built from the bytes must be thrown away then (a
    restore into memory, at start).

    Args:
        path: the file (for messages).
        fd: the caller's open descriptor of it (the same file the parser maps, even if the
            path is renamed over meanwhile).
        size: its size when the parser mapped it (the bytes hashed).
        sha256: the expected digest.
    """

    def __init__(self, path: Path, fd: int, size: int, sha256: str) -> None:
        self._path, self._fd, self._size, self._expected = path, fd, size, sha256
        self._digest = hashlib.sha256()
        self._failure: OSError | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._hash, name="ember-verify")
        self._thread.start()

    def _hash(self) -> None:
        offset = 0
        try:
            while offset < self._size and not self._stop.is_set():
                chunk = os.pread(self._fd, min(_READ_CHUNK, self._size - offset), offset)
                if not chunk:
                    break  # cut short since it was mapped: the digest cannot match
                self._digest.update(chunk)
                offset += len(chunk)
        except OSError as error:
            self._failure = error

    def finish(self, check: bool = True) -> None:
        """Wait for the digest and compare it; without ``check``, stop reading and compare
        nothing (the caller failed already).

        Raises:
            DurableFileCorruptError: it does not match.
            OSError: the file could not be read.
        """
        if not check:
            self._stop.set()
        self._thread.join()
        if not check:
            return
        if self._failure is not None:
            raise self._failure
        if check and self._digest.hexdigest() != self._expected:
            raise DurableFileCorruptError(
                f"{self._path}: sha256 {self._digest.hexdigest()} does not match the expected "
                f"{self._expected}; the file is corrupt (found while loading it: refuse what "
                "was loaded)"
            )
