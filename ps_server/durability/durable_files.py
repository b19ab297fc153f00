"""Files that are either complete and checksummed or absent: write to a temp name, fsync, rename."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import TracebackType
from typing import Self

from ember.ps_server.errors import DurableFileCorruptError

_READ_CHUNK = 1 << 22


class DurableWriter:
    """Writes ``path`` through ``path.tmp``; :meth:`commit` fsyncs and renames it into place.

    Counts the bytes and their sha256 as they go. Leaving the ``with`` block
    without committing (an error) removes the temp file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.bytes = 0
        self._hash = hashlib.sha256()
        self._tmp = path.with_name(path.name + ".tmp")
        self._file = open(self._tmp, "wb")  # noqa: SIM115 - closed by commit or __exit__

    def write(self, data: bytes | memoryview) -> None:
        """Append ``data``."""
        self._file.write(data)
        self._hash.update(data)
        self.bytes += memoryview(data).nbytes

    @property
    def sha256(self) -> str:
        """Hex sha256 of what was written so far."""
        return self._hash.hexdigest()

    def commit(self) -> None:
        """Flush, fsync, rename into place and fsync the directory."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._tmp, self.path)
        fsync_directory(self.path.parent)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._file.closed:
            self._file.close()
            self._tmp.unlink(missing_ok=True)


def write_durably(path: Path, data: bytes) -> str:
    """Write ``data`` to ``path`` atomically and durably; returns its sha256."""
    with DurableWriter(path) as writer:
        writer.write(data)
        writer.commit()
        return writer.sha256


def fsync_directory(directory: Path) -> None:
    """Make renames and creations in ``directory`` durable."""
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def verify_file(path: Path, sha256: str, size: int | None = None) -> None:
    """Raise DurableFileCorruptError, naming the file and checksums, unless ``path`` matches.

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
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        while chunk := source.read(_READ_CHUNK):
            digest.update(chunk)
    if digest.hexdigest() != sha256:
        raise DurableFileCorruptError(
            f"{path}: sha256 {digest.hexdigest()} does not match the expected {sha256}; "
            "the file is corrupt"
        )
