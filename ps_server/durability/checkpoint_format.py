"""On-disk format of checkpoints: row files, shard metadata and the manifest.

A checkpoint is a directory ``<root>/<id>/`` holding, per shard, one row file
per table and one metadata file, and ``manifest.json``, written last
(temp file, fsync, rename): a directory without a manifest is an unfinished
checkpoint and never read. The manifest lists every file with its size and
sha256 and carries its own sha256, so any damage is found before anything
is loaded. An incremental checkpoint names its ``base``, a sibling directory.

Row file (little-endian): magic ``EMBERCK1``, a uint32 length and a JSON
header ``{"table", "dim", "state_width"}``, then chunks of a uint64 row
count followed by that many ids (int64), weights (float32 x dim), optimizer
state (float32 x state_width) and versions (int64).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import struct
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ember.ps_server.durability.durable_files import (
    DurableWriter,
    HashAhead,
    verify_file,
    write_durably,
)
from ember.ps_server.errors import CheckpointStateError, DurableFileCorruptError
from ember.ps_server.stores import RowBatch
from ember.ps_server.wire.messages import pb
from ember.ps_server.wire.table_spec import TableSpec
from google.protobuf import json_format

FORMAT = "ember-checkpoint/1"
MANIFEST = "manifest.json"
ROW_MAGIC = b"EMBERCK1"
CHECKPOINT_ID = re.compile(r"^ckpt-(\d{6,})$")


@dataclasses.dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint: path relative to its directory, table ('' for metadata)."""

    path: str
    table: str
    rows: int
    bytes: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What a checkpoint holds; see the module docstring."""

    id: str
    base: str | None
    num_shards: int
    tables: list[TableSpec]
    files: dict[int, list[FileEntry]]  # by shard
    created_unix: float = dataclasses.field(default_factory=time.time)

    def write(self, directory: Path) -> None:
        """Write ``manifest.json`` into ``directory`` atomically and durably."""
        body = {
            "format": FORMAT,
            "id": self.id,
            "base": self.base,
            "num_shards": self.num_shards,
            "created_unix": self.created_unix,
            "tables": [json_format.MessageToDict(spec.to_proto()) for spec in self.tables],
            "files": {
                str(shard): [dataclasses.asdict(entry) for entry in entries]
                for shard, entries in sorted(self.files.items())
            },
        }
        text = json.dumps(body, sort_keys=True)
        document = {"body": body, "sha256": _sha256_text(text)}
        write_durably(directory / MANIFEST, json.dumps(document, indent=1).encode())

    @classmethod
    def load(cls, directory: Path) -> Manifest:
        """The manifest in ``directory``.

        Raises:
            FileNotFoundError: no manifest (not a finished checkpoint).
            DurableFileCorruptError: unreadable, or its checksum does not match.
        """
        path = directory / MANIFEST
        try:
            document = json.loads(path.read_bytes())
            body = document["body"]
            expected = document["sha256"]
        except (ValueError, KeyError, TypeError) as error:
            raise DurableFileCorruptError(f"{path}: not a readable manifest ({error})") from error
        actual = _sha256_text(json.dumps(body, sort_keys=True))
        if actual != expected:
            raise DurableFileCorruptError(
                f"{path}: sha256 {actual} does not match the recorded {expected}; "
                "the manifest is corrupt"
            )
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            found = body.get("format") if isinstance(body, dict) else type(body).__name__
            raise DurableFileCorruptError(f"{path}: format {found!r}, expected {FORMAT}")
        try:
            return cls(
                id=body["id"],
                base=body["base"],
                num_shards=int(body["num_shards"]),
                created_unix=body["created_unix"],
                tables=[
                    TableSpec.from_proto(json_format.ParseDict(spec, pb.TableSpec()))
                    for spec in body["tables"]
                ],
                files={
                    int(shard): [FileEntry(**entry) for entry in entries]
                    for shard, entries in body["files"].items()
                },
            )
        except (ValueError, KeyError, TypeError, AttributeError, json_format.ParseError) as error:
            raise DurableFileCorruptError(
                f"{path}: manifest fields unreadable ({error!r})"
            ) from error

    def files_for(self, shard: int, num_shards: int) -> list[FileEntry]:
        """The files a restore of ``shard`` of ``num_shards`` reads: its own when the shard
        count is the same (it owns exactly the rows it wrote), else every shard's.

        Raises:
            DurableFileCorruptError: the same shard count, but the manifest lists no files
                of ``shard``.
            CheckpointStateError: another shard count, and the checkpoint holds only some
                shards' files (a shard's automatic checkpoint): the rest would be lost.
        """
        held = sorted(self.files)
        if self.num_shards != num_shards:
            if held != list(range(self.num_shards)):
                raise CheckpointStateError(
                    f"checkpoint {self.id} holds the rows of shard(s) {held} of "
                    f"{self.num_shards} only (a shard's automatic checkpoint): it restores onto "
                    f"that shard of {self.num_shards} only, not onto {num_shards} shards. "
                    "Reshard from a checkpoint of the whole cluster (ember checkpoint)"
                )
            return [entry for entries in self.files.values() for entry in entries]
        if shard not in self.files:
            raise DurableFileCorruptError(
                f"checkpoint {self.id}: its manifest lists no files of shard {shard} of "
                f"{num_shards}; it holds shard(s) {held} (a shard's automatic checkpoint "
                "restores onto that shard only)"
            )
        return self.files[shard]

    def verify(
        self, directory: Path, entries: list[FileEntry] | None = None, contents: bool = True
    ) -> None:
        """Check the size and sha256 of ``entries`` (default: every listed file); only their
        presence and size without ``contents`` (their readers check the sha256).

        Raises:
            DurableFileCorruptError: on the first bad one.
        """
        if entries is None:
            entries = [entry for listed in self.files.values() for entry in listed]
        for entry in entries:
            verify_file(directory / entry.path, entry.sha256, entry.bytes, contents)


def checkpoint_chain(
    path: Path, shard: int | None = None, num_shards: int | None = None, contents: bool = True
) -> list[tuple[Path, Manifest]]:
    """The checkpoint at ``path`` and its bases, oldest (the full one) first.

    ``path`` is a checkpoint directory, or a root whose newest finished
    checkpoint is taken. Every file of the chain is verified, or, for
    ``shard`` of ``num_shards``, every file its restore reads
    (:meth:`Manifest.files_for`); without ``contents`` only their presence
    and size (the restore then checks each sha256 as it reads).

    Raises:
        FileNotFoundError: no finished checkpoint there, or a base is missing.
        DurableFileCorruptError: a manifest or file fails its checks.
    """
    directory = resolve_checkpoint(path)
    chain: list[tuple[Path, Manifest]] = []
    while True:
        manifest = Manifest.load(directory)
        entries = None if shard is None else manifest.files_for(shard, num_shards)
        manifest.verify(directory, entries, contents)
        chain.append((directory, manifest))
        if manifest.base is None:
            return chain[::-1]
        directory = directory.parent / manifest.base
        if not (directory / MANIFEST).exists():
            raise FileNotFoundError(
                f"{chain[-1][0]}: its base checkpoint {manifest.base!r} is missing at {directory}"
            )


def resolve_checkpoint(path: Path) -> Path:
    """``path`` if it is a finished checkpoint, else the newest finished one under it.

    Raises:
        FileNotFoundError: neither.
    """
    directory = path if (path / MANIFEST).exists() else latest_checkpoint(path)
    if directory is None:
        raise FileNotFoundError(f"{path}: no finished checkpoint (no {MANIFEST})")
    return directory.resolve()


def latest_checkpoint(root: Path) -> Path | None:
    """The finished checkpoint with the highest number under ``root``, if any."""
    finished = [
        entry
        for entry in root.iterdir()
        if CHECKPOINT_ID.match(entry.name) and (entry / MANIFEST).exists()
    ] if root.is_dir() else []  # fmt: skip
    return max(finished, key=lambda entry: int(entry.name[5:]), default=None)


def next_checkpoint_id(root: Path) -> str:
    """An id above every checkpoint directory under ``root``, finished or not."""
    numbers = [
        int(match.group(1))
        for entry in (root.iterdir() if root.is_dir() else [])
        if (match := CHECKPOINT_ID.match(entry.name))
    ]
    return f"ckpt-{max(numbers, default=0) + 1:06d}"


def shard_file_prefix(shard: int, num_shards: int) -> str:
    """How the names of ``shard``'s files in a checkpoint begin."""
    return f"shard-{shard}-of-{num_shards}."


def row_file_name(shard: int, num_shards: int, table: str) -> str:
    """Name of the row file of ``table`` on ``shard``."""
    return f"{shard_file_prefix(shard, num_shards)}{table}.rows"


def shard_files_in(directory: Path, shard: int, num_shards: int) -> list[Path]:
    """``shard``'s files in checkpoint ``directory`` (whole or partly written), by name."""
    prefix = shard_file_prefix(shard, num_shards)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.name.startswith(prefix))


def write_row_file(
    path: Path,
    table: str,
    dim: int,
    state_width: int,
    chunks: Iterable[tuple[np.ndarray, RowBatch]],
) -> FileEntry:
    """Write the rows of ``chunks`` durably to ``path``."""
    header = json.dumps({"table": table, "dim": dim, "state_width": state_width}).encode()
    rows = 0
    with DurableWriter(path) as writer:
        writer.write(ROW_MAGIC + struct.pack("<I", len(header)) + header)
        for ids, batch in chunks:
            writer.write(struct.pack("<Q", len(ids)))
            writer.write(np.ascontiguousarray(ids, dtype="<i8").data)
            for part in (batch.weights, batch.state, batch.versions):
                writer.write(part.contiguous().numpy().data)
            rows += len(ids)
        writer.commit()
        return FileEntry(path.name, table, rows, writer.bytes, writer.sha256)


def read_row_file(
    path: Path, dim: int, state_width: int, sha256: str | None = None
) -> Iterator[tuple[np.ndarray, RowBatch]]:
    """The ``(ids, rows)`` chunks of a row file: verify it first (:meth:`Manifest.verify`),
    or give its ``sha256`` to have it checked while it is read (:class:`HashAhead`).

    The check completes only when the caller has taken every chunk: a caller that
    stops early must not use what it read.

    Raises:
        DurableFileCorruptError: a header or chunk that is cut short, unreadable,
            or does not fit the table's layout; after the last chunk, a ``sha256``
            that does not match.
    """
    with open(path, "rb") as handle:  # one open file for the parser and the check
        size = os.fstat(handle.fileno()).st_size
        view = memoryview(np.memmap(handle, dtype=np.uint8, mode="r")) if size else b""
        checking = HashAhead(path, handle.fileno(), size, sha256) if sha256 else None
        try:
            yield from _row_chunks(path, view, dim, state_width)
        except BaseException:  # the reader's own error wins; the thread stops first
            if checking is not None:
                checking.finish(check=False)
            raise
        if checking is not None:
            checking.finish()


def _row_chunks(
    path: Path, view: memoryview | bytes, dim: int, state_width: int
) -> Iterator[tuple[np.ndarray, RowBatch]]:
    """:func:`read_row_file`'s parsing."""
    offset = len(ROW_MAGIC) + 4
    if len(view) < offset or bytes(view[: len(ROW_MAGIC)]) != ROW_MAGIC:
        raise DurableFileCorruptError(f"{path}: not a checkpoint row file (magic {ROW_MAGIC!r})")
    (header_bytes,) = struct.unpack_from("<I", view, len(ROW_MAGIC))
    if offset + header_bytes > len(view):
        raise DurableFileCorruptError(f"{path}: its {header_bytes}-byte header runs past the end")
    try:
        header = json.loads(bytes(view[offset : offset + header_bytes]))
        widths = (header["dim"], header["state_width"])
    except (ValueError, KeyError, TypeError) as error:
        raise DurableFileCorruptError(f"{path}: unreadable header ({error})") from error
    if widths != (dim, state_width):
        raise DurableFileCorruptError(
            f"{path}: rows of width {widths[0]} with state {widths[1]}, "
            f"but the table has {dim} and {state_width}"
        )
    offset += header_bytes
    row_bytes = 8 + 4 * dim + 4 * state_width + 8
    while offset < len(view):
        if offset + 8 > len(view):
            raise DurableFileCorruptError(f"{path}: a chunk header at byte {offset} is cut short")
        (count,) = struct.unpack_from("<Q", view, offset)
        offset += 8
        if count > (len(view) - offset) // row_bytes:
            raise DurableFileCorruptError(f"{path}: a chunk of {count} rows runs past the end")
        parts: list[Any] = []
        for dtype, width in (("<i8", 1), ("<f4", dim), ("<f4", state_width), ("<i8", 1)):
            size = count * width * np.dtype(dtype).itemsize
            parts.append(np.frombuffer(view[offset : offset + size], dtype=dtype).copy())
            offset += size
        ids, weights, state, versions = parts
        yield (
            ids.astype(np.int64),
            RowBatch(
                weights=torch.from_numpy(weights.reshape(count, dim)),
                state=torch.from_numpy(state.reshape(count, state_width)),
                versions=torch.from_numpy(versions.astype(np.int64)),
            ),
        )


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
