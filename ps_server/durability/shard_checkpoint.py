"""One shard's side of checkpoints: the pause, writing its files, committing, and restoring
a checkpoint chain (the loading itself is :mod:`checkpoint_restore`'s).

Checkpoint files are written only under the shard's checkpoint root
(``--checkpoint-root``): a directory that resolves elsewhere (``..``, a
symlink) is refused, and so is every checkpoint when no root is set, so a
peer cannot have the shard write files anywhere. A pause holds writes for at
most :data:`MAX_PAUSE_LEASE_S`.

Restoring onto the checkpoint's own shard count reads only this shard's
files; onto another count it reads every shard's files and keeps the rows
this shard owns, so a checkpoint of N shards restores onto M. The push
deduplication windows come back only when N == M (request ids are per shard).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ember.ps_server.durability.checkpoint_format import (
    MANIFEST,
    FileEntry,
    Manifest,
    checkpoint_chain,
    row_file_name,
    shard_file_prefix,
    shard_files_in,
)
from ember.ps_server.durability.checkpoint_requests import check_checkpoint_id, check_cut
from ember.ps_server.durability.checkpoint_restore import check_specs, restore_chain, shard_meta
from ember.ps_server.durability.durable_files import make_directory_durably, write_durably
from ember.ps_server.errors import (
    CheckpointStateError,
    InvalidArgumentError,
    PermissionDeniedError,
)
from ember.ps_server.shard.table import Table
from ember.ps_server.wire.table_spec import TableSpec

if TYPE_CHECKING:
    from ember.ps_server.shard.server import ParameterServer


MAX_PAUSE_LEASE_S = 300.0
"""The longest a checkpoint may hold a shard's writes before it writes its files."""

Chain = list[tuple[Path, Manifest]]


class ShardCheckpoints:
    """The checkpoint verbs of one shard (driven by a coordinator over RPC), and restore.

    Args:
        server: the shard (its tables, its shard numbers and its write gate).
        root: the directory checkpoint files may be written under ('' refuses them all).
    """

    def __init__(self, server: ParameterServer, root: str = "") -> None:
        self._server = server
        self._root = Path(os.path.realpath(root)) if root else None
        self._lock = threading.Lock()  # one checkpoint's write or commit at a time
        self._calls_lock = threading.Lock()
        self._writing: set[str] = set()  # checkpoint ids whose write() runs now
        self._written_checkpoint: str | None = None  # files written, manifest not confirmed yet
        self._written_directory = Path()
        self._written_log_segment = 0  # first write-log segment after the written checkpoint
        self._committed_directory: Path | None = None  # base of the next incremental one

    def pause(self, checkpoint_id: str, lease_s: float) -> None:
        """Finish writes in flight and hold new ones for ``checkpoint_id`` (see WriteGate).

        Raises:
            InvalidArgumentError: a bad id, or a lease not in (0, MAX_PAUSE_LEASE_S].
        """
        check_checkpoint_id(checkpoint_id)
        if not 0 < lease_s <= MAX_PAUSE_LEASE_S:
            raise InvalidArgumentError(
                f"pause lease must be in (0, {MAX_PAUSE_LEASE_S:g}] seconds, got {lease_s}"
            )
        self._server.fault.check()
        self._server.gate.pause(checkpoint_id, lease_s)

    def resume(self, checkpoint_id: str) -> bool:
        """Let writes in again (a coordinator abandoning ``checkpoint_id``); whether this shard
        still writes that checkpoint's files (then writes resume once they are written)."""
        return self._server.gate.resume(checkpoint_id)

    def write(
        self,
        checkpoint_id: str,
        directory: str,
        base_id: str,
        cut: dict[str, list[int]] | None = None,
    ) -> tuple[list[FileEntry], list[TableSpec]]:
        """Write this shard's files of ``checkpoint_id`` under ``directory``, then resume writes.

        First the clocks of ``cut`` (per job, each rank's highest clock the checkpoint
        holds) that this shard has not applied pass the pause, and only those.

        A call that fails before it writes files writes none, and resumes writes; one
        that fails while writing them may leave some, never committed (see :meth:`commit`).
        A second call for the same checkpoint while one runs is refused and changes nothing;
        a call into a directory that holds this shard's files already (a client's retry
        after the first call wrote them, or another checkpoint's directory) is refused, the
        files stay as they are and a pause the id holds is let go. Either way that
        checkpoint fails (the coordinator takes a new one). While the files are written,
        writes stay paused whatever arrives (see :meth:`WriteGate.claim`).

        Raises:
            CheckpointStateError: writes are not paused for it, the cut was not reached
                within the pause lease, ``base_id`` is not this shard's last committed
                checkpoint, another call writes this checkpoint now, or ``directory`` holds
                this shard's files already.
            InvalidArgumentError: ``directory`` is not an absolute path, or a bad cut.
            PermissionDeniedError: ``directory`` is outside the checkpoint root or holds a
                finished checkpoint, or there is no root.
        """
        check_checkpoint_id(checkpoint_id)
        gate = self._server.gate
        with self._only_call(checkpoint_id):
            try:
                target = self.checked_directory(directory)
                self._refuse_written(checkpoint_id, target)  # early, for a retry's sake
                self._server.fault.check()
                self._reach_cut(checkpoint_id, check_cut(cut or {}))
                gate.claim(checkpoint_id)
            except BaseException:  # nothing written: writes go on
                gate.end_claim(checkpoint_id)
                gate.resume(checkpoint_id)
                raise
            try:
                with self._lock:
                    return self._write_files(checkpoint_id, target, base_id)
            finally:
                gate.end_claim(checkpoint_id)

    @contextlib.contextmanager
    def _only_call(self, checkpoint_id: str) -> Iterator[None]:
        """The block as the only :meth:`write` of ``checkpoint_id`` running.

        Raises:
            CheckpointStateError: another call writes it now (nothing done).
        """
        with self._calls_lock:
            if checkpoint_id in self._writing:
                raise CheckpointStateError(
                    f"checkpoint {checkpoint_id!r} refused: an earlier call is writing it on "
                    "this shard (a retry?); take a new checkpoint"
                )
            self._writing.add(checkpoint_id)
        try:
            yield
        finally:
            with self._calls_lock:
                self._writing.discard(checkpoint_id)

    def _write_files(
        self, checkpoint_id: str, target: Path, base_id: str
    ) -> tuple[list[FileEntry], list[TableSpec]]:
        """:meth:`write`'s files, under the pause and this object's lock."""
        self._refuse_written(checkpoint_id, target)  # again: this call may have waited
        if base_id and target.parent / base_id != self._committed_directory:
            raise CheckpointStateError(
                f"incremental checkpoint on base {base_id!r} refused: this shard's last "
                f"committed checkpoint is {self._committed_directory}; take a full one"
            )
        # From the rotation on, no earlier written checkpoint may commit: it would drop
        # the segment being closed now, whose writes only this checkpoint holds.
        self._written_checkpoint = None
        tables = list(self._server.tables().values())
        write_log = self._server.journal.log
        segment = write_log.rotate() if write_log is not None else 0
        files = write_shard_files(
            tables, self._server.shard, self._server.num_shards, target, bool(base_id),
            self._server.steps.clocks.snapshot(), self._server.steps.replicas.snapshot(),
        )  # fmt: skip
        self._server.fault.check()  # nothing read while the shard failed is a checkpoint
        self._written_checkpoint, self._written_directory = checkpoint_id, target
        self._written_log_segment = segment
        return files, [table.spec for table in tables]

    def _refuse_written(self, checkpoint_id: str, target: Path) -> None:
        """Refuse a ``target`` that holds a finished checkpoint (PermissionDeniedError) or any
        file of this shard's (CheckpointStateError): a shard never writes over them."""
        _refuse_finished(target)
        own = shard_files_in(target, self._server.shard, self._server.num_shards)
        if own:
            raise CheckpointStateError(
                f"checkpoint {checkpoint_id!r} refused: {target} already holds this shard's "
                f"files ({own[0].name}): a retried or repeated checkpoint never writes over "
                "them; take a new checkpoint (or delete that unfinished directory)"
            )

    def _reach_cut(self, checkpoint_id: str, cut: dict[str, list[int]]) -> None:
        """Apply the clocks of ``cut`` still missing here (and no later ones) under the pause;
        a clock of it this shard refuses (too large to log), before or during the wait, ends
        the wait at once (the caller then resumes writes)."""
        clocks, gate = self._server.steps.clocks, self._server.gate
        reached = clocks.cut_reached(cut)
        if reached():
            return

        def refused() -> bool:
            return bool(clocks.refusals(cut))

        admitted = refused() or gate.admit_until(
            checkpoint_id, clocks.cut_admits(cut), lambda: reached() or refused()
        )
        refusals = clocks.refusals(cut)
        if not refusals and admitted and reached():
            return
        refused_here = f"checkpoint {checkpoint_id!r} refused: "
        if refusals:  # waiting longer would not help
            raise CheckpointStateError(
                f"{refused_here}this shard can never reach the clock cut, which another shard "
                f"has applied: {'; '.join(refusals)}"
            )
        applied = {job: clocks.snapshot().get(job, {}).get("applied") for job in cut}
        if admitted:
            raise CheckpointStateError(
                f"{refused_here}this shard refused a clock of the cut {cut} and no longer knows "
                f"why (its job was pushed out of the idle jobs kept, or restored); applied "
                f"here: {applied}"
            )
        raise CheckpointStateError(
            f"{refused_here}writes were not held for it until this shard reached the clock cut "
            f"{cut} (the pause lease ran out, or it was never paused); applied here: {applied}. "
            "A rank that has not delivered those clocks has died or fallen behind"
        )

    def commit(self, checkpoint_id: str) -> None:
        """The manifest of ``checkpoint_id`` is durable: it becomes the incremental base.

        The write log drops the segments the checkpoint covers, and records
        the checkpoint as the one to restore before replaying the rest.
        """
        self._server.fault.check()
        with self._lock:
            if checkpoint_id != self._written_checkpoint:
                raise CheckpointStateError(
                    f"commit of checkpoint {checkpoint_id!r} refused: this shard last wrote "
                    f"{self._written_checkpoint!r}"
                )
            if not (self._written_directory / MANIFEST).exists():
                raise CheckpointStateError(
                    f"commit of checkpoint {checkpoint_id!r} refused: {self._written_directory} "
                    "has no manifest (the log may only continue a finished checkpoint)"
                )
            for table in self._server.tables().values():
                table.changes.commit()
            self._committed_directory = self._written_directory
            write_log = self._server.journal.log
            if write_log is not None:
                write_log.commit_base(self._written_directory, self._written_log_segment)

    @property
    def committed_directory(self) -> Path | None:
        """The last checkpoint committed here (restored or written): the base of the next
        incremental one, and the one the write log continues from."""
        return self._committed_directory

    def checked_directory(self, directory: str) -> Path:
        """``directory`` resolved, if it lies under the checkpoint root.

        Raises:
            InvalidArgumentError: not an absolute path.
            PermissionDeniedError: no root, or it resolves outside the root.
        """
        if self._root is None:
            raise PermissionDeniedError(
                "this shard writes no checkpoints: it was started without --checkpoint-root "
                "(env EMBER_CHECKPOINT_ROOT); restart it with the directory checkpoints go under"
            )
        path = Path(directory)
        if not path.is_absolute():
            raise InvalidArgumentError(f"checkpoint directory must be absolute, got {directory!r}")
        try:
            resolved = Path(os.path.realpath(path))
        except (ValueError, OSError) as error:
            raise InvalidArgumentError(f"bad checkpoint directory {directory!r}: {error}") from None
        if self._root not in resolved.parents:
            raise PermissionDeniedError(
                f"checkpoint directory {directory!r} resolves to {resolved}, which is not "
                f"inside this shard's checkpoint root {self._root}; refused"
            )
        _refuse_finished(resolved)
        return resolved

    def load_chain(self, path: Path) -> Chain:
        """The verified checkpoint chain at ``path`` (a checkpoint or a root) that
        :meth:`restore` reads: only this shard's files when the shard count is the same.

        A shard whose rows live in its memory checks each file's sha256 while
        :meth:`restore` reads it (one read instead of two; a mismatch fails the restore,
        and so the start, and the partly loaded rows go with the process). A shard over
        Redis checks every file first, before its rows there are deleted.

        Raises:
            FileNotFoundError: no finished checkpoint at ``path``, or a base is missing.
            DurableFileCorruptError: a file this shard reads fails its checks.
        """
        return checkpoint_chain(
            path, self._server.shard, self._server.num_shards, not self._rows_in_memory
        )

    @property
    def _rows_in_memory(self) -> bool:
        return self._server.store_url in ("", "memory")

    def restore(self, chain: Chain) -> int:
        """Replace this shard's tables by a chain from :meth:`load_chain`.

        Tables of the checkpoint are created (or reset, when they exist with
        the same spec); this shard keeps the rows it owns. Returns the rows loaded.

        Raises:
            DurableFileCorruptError: a file is unreadable.
            CheckpointStateError: a table exists with another spec (nothing changed).
        """
        latest = chain[-1][1]
        with self._server.gate.writing():
            check_specs(latest, self._server.tables())
            for spec in latest.tables:
                self._server.ensure_table(spec)
            rows = restore_chain(
                chain, self._server.shard, self._server.num_shards, self._server.tables(),
                verified=not self._rows_in_memory,
            )  # fmt: skip
            meta = shard_meta(*chain[-1], self._server.shard, self._server.num_shards)
            self._server.steps.clocks.restore(meta.get("step_clocks", {}))
            self._server.steps.replicas.restore(meta.get("replica_jobs", {}))
        with self._lock:
            self._committed_directory, self._written_checkpoint = chain[-1][0], None
        return rows


def _refuse_finished(directory: Path) -> None:
    """Refuse to write into a finished checkpoint (PermissionDeniedError)."""
    if (directory / MANIFEST).exists():
        raise PermissionDeniedError(
            f"checkpoint directory {directory} holds a finished checkpoint; a new "
            "checkpoint never overwrites one (the write-ahead log may depend on it)"
        )


def write_shard_files(
    tables: list[Table],
    shard: int,
    num_shards: int,
    directory: Path,
    incremental: bool,
    step_clocks: dict[str, dict] | None = None,
    replica_jobs: dict[str, list[str]] | None = None,
) -> list[FileEntry]:
    """Write a row file per table and the shard's metadata file into ``directory``
    (the push deduplication windows, the training jobs' step clocks and which of them hold
    or released hot-row replicas)."""
    make_directory_durably(directory)
    files = [
        table.write_snapshot(
            directory / row_file_name(shard, num_shards, table.spec.name), incremental
        )
        for table in tables
    ]
    meta = {
        "shard": shard,
        "num_shards": num_shards,
        "applied_request_ids": {t.spec.name: t.applied_request_ids() for t in tables},
        "step_clocks": step_clocks or {},
        "replica_jobs": replica_jobs or {},
    }
    meta_path = directory / f"{shard_file_prefix(shard, num_shards)}meta.json"
    data = json.dumps(meta).encode()
    files.append(FileEntry(meta_path.name, "", 0, len(data), write_durably(meta_path, data)))
    return files
