"""AutoCheckpoints: a shard that checkpoints itself, so its write-ahead log stays bounded.

With ``--wal-max-bytes B`` the shard checkpoints once its log holds ``B``
bytes since its last checkpoint; with ``--checkpoint-interval-s T`` also
every ``T`` seconds while the log holds anything. A checkpoint pauses the
shard's writes, rotates the log, writes this shard's files into
``<checkpoint root>/auto/shard-S-of-N/ckpt-NNNNNN``, writes the manifest
(listing this shard's files only: it restores onto this shard only), and
commits: the log records it as its base and drops the segments before it.
Then :func:`prune_checkpoints` keeps the newest ``--checkpoint-keep``.
Checkpoints of the whole cluster stay with the coordinator (``ember
checkpoint``); one that comes between two automatic ones makes the next
automatic one full.

Increments: a checkpoint is incremental (only the rows changed since the
last one) unless there is no automatic base yet, the chain holds
:data:`MAX_CHAIN` checkpoints, or its increments together outweigh its full
checkpoint. A restore so reads at most about three times the rows' bytes (a
full checkpoint, increments up to its size, and one more increment).

The bound: the log on disk stays below ``B`` plus what arrives between the
trigger and the pause (writes wait while the files are written), and a
restart restores at most three times the table bytes and replays at most
that log.

Failures: a checkpoint that fails (a full disk) changes nothing the shard
serves from, since the log still holds every write since the last committed
checkpoint; its unfinished directory is deleted. The shard goes on serving,
reports NOT_SERVING to health checks with the reason, and retries, backing
off from 1 to 60 s; the next success reports SERVING again. A checkpoint
that finds another one holding the pause (the coordinator's) retries a
second later, and reports NOT_SERVING once that has lasted
:data:`BUSY_REPORT_S`. Old checkpoints are pruned after each success; a
prune that fails is logged and retried after the next one.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ember.ps_server.durability.checkpoint_format import MANIFEST, Manifest, next_checkpoint_id
from ember.ps_server.durability.durable_files import fsync_directory, make_directory_durably
from ember.ps_server.durability.retention import prune_checkpoints
from ember.ps_server.errors import CheckpointStateError, ShardFailedError

if TYPE_CHECKING:
    from ember.ps_server.durability.write_log import WriteLog
    from ember.ps_server.shard.server import ParameterServer

log = logging.getLogger(__name__)

MAX_CHAIN = 8
"""Most checkpoints in one chain (a full one and its increments)."""
PAUSE_LEASE_S = 60.0
FIRST_RETRY_S, LAST_RETRY_S, BUSY_RETRY_S = 1.0, 60.0, 1.0
BUSY_REPORT_S = 60.0
"""Held off by other checkpoints this long, the shard reports NOT_SERVING."""


@dataclasses.dataclass(frozen=True)
class AutoPolicy:
    """When a shard checkpoints itself, and how many checkpoints it keeps."""

    max_bytes: int | None
    interval_s: float | None
    keep: int


def auto_directory(root: Path, shard: int, num_shards: int) -> Path:
    """Where shard ``shard`` of ``num_shards`` keeps its automatic checkpoints."""
    return root / "auto" / f"shard-{shard}-of-{num_shards}"


def incremental_base(directory: Path, committed: Path | None) -> Path | None:
    """The checkpoint the next one in ``directory`` increments, or None for a full one: the
    last ``committed`` one when it lies in ``directory``, its chain holds fewer than
    :data:`MAX_CHAIN` checkpoints and its increments weigh no more than its full one."""
    if committed is None or committed.parent != directory:
        return None
    links, increments, full = 0, 0, 0
    current = committed
    while True:
        manifest = Manifest.load(current)
        size = sum(entry.bytes for entries in manifest.files.values() for entry in entries)
        links += 1
        if manifest.base is None:
            full = size
            break
        increments += size
        current = current.parent / manifest.base
        if not (current / MANIFEST).exists() or links >= MAX_CHAIN:
            return None
    return committed if links < MAX_CHAIN and increments <= full else None


class AutoCheckpoints:
    """The checkpointing thread of one shard (see the module docstring).

    Args:
        server: the shard (its checkpoint verbs, its shard numbers).
        write_log: the shard's log, whose growth wakes the thread.
        directory: where the checkpoints go (see :func:`auto_directory`).
        policy: when to checkpoint and how many to keep.
        report: told ``None`` after each success and the reason after each failure
            (the shard's health).
    """

    def __init__(
        self,
        server: ParameterServer,
        write_log: WriteLog,
        directory: Path,
        policy: AutoPolicy,
        report: Callable[[str | None], None],
    ) -> None:
        self._server, self._log, self.directory = server, write_log, directory
        self._policy, self._report = policy, report
        self._wake, self._closed = threading.Event(), threading.Event()
        self._last = time.monotonic()
        self.taken = self.failed = 0
        self._thread = threading.Thread(target=self._run, name="ember-auto-ckpt", daemon=True)

    def start(self) -> None:
        """Start watching the log (checkpoints at once if it is already over its limit).

        Raises:
            PermissionDeniedError: the directory resolves outside the checkpoint root.
            OSError: it cannot be made.
        """
        make_directory_durably(self.directory)
        self._server.checkpoints.checked_directory(str(self.directory))
        self._log.on_append = self._heard
        self._thread.start()
        self._wake.set()

    def close(self) -> None:
        """Stop (a checkpoint being written finishes first)."""
        self._closed.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()

    def checkpoint(self) -> Path:
        """Take one checkpoint now; returns its directory.

        The attempt makes its directory itself: a name taken meanwhile fails it, and the
        attempt leaves what is there alone (retention later removes an unfinished directory
        below the newest finished checkpoint, as it does any leftover). An attempt that
        fails before its manifest is written leaves nothing behind but the log's new
        segment: its unfinished directory is deleted, so retries on a full disk find the
        room the last one had, under the same name. One that fails after (the directory's
        fsync, the commit) leaves a finished checkpoint that is not the log's base; the
        next attempt takes the next name.

        Raises:
            CheckpointStateError: another checkpoint holds the shard's pause.
            ShardFailedError: the shard has failed.
            FileExistsError: the next name was taken meanwhile (nothing written).
            OSError, EmberError: writing failed (nothing committed).
        """
        checkpoints = self._server.checkpoints
        log_bytes = self._log.bytes_since_base
        base = incremental_base(self.directory.resolve(), checkpoints.committed_directory)
        target = self.directory / next_checkpoint_id(self.directory)
        gate_id = f"auto-{target.name}"
        checkpoints.pause(gate_id, PAUSE_LEASE_S)
        made = False
        try:
            try:
                # Made here, exclusively: a directory someone else made under this name
                # meanwhile fails the attempt (FileExistsError), never written into or
                # deleted by it. (Its parent is made again if an operator removed it.)
                make_directory_durably(self.directory)
                target.mkdir()
                made = True
                fsync_directory(self.directory)
                files, specs = checkpoints.write(gate_id, str(target), base.name if base else "")
            finally:
                # write() resumes writes itself; this covers a failure before or at its start.
                checkpoints.resume(gate_id)
            Manifest(
                id=target.name,
                base=base.name if base else None,
                num_shards=self._server.num_shards,
                tables=specs,
                files={self._server.shard: files},
            ).write(target)
            fsync_directory(self.directory)  # the base file may name it only once it lasts
        except BaseException:
            if made and not (target / MANIFEST).exists():
                shutil.rmtree(target, ignore_errors=True)
            raise
        checkpoints.commit(gate_id)
        log.info(
            "automatic %s checkpoint %s written (the log held %d bytes)",
            "incremental" if base else "full", target, log_bytes,
        )  # fmt: skip
        return target

    def prune(self) -> None:
        """Delete the checkpoints the policy does not keep (never the log's base's chain)."""
        log_base, _ = self._log.base()
        committed = self._server.checkpoints.committed_directory
        protected = [path.resolve() for path in (log_base, committed) if path is not None]
        prune_checkpoints(self.directory.resolve(), self._policy.keep, protected)

    def _heard(self, bytes_since_base: int) -> None:
        if self._policy.max_bytes is not None and bytes_since_base >= self._policy.max_bytes:
            self._wake.set()

    def _due(self) -> bool:
        pending = self._log.bytes_since_base
        policy = self._policy
        if policy.max_bytes is not None and pending >= policy.max_bytes:
            return True
        if policy.interval_s is None or time.monotonic() - self._last < policy.interval_s:
            return False
        if not pending:  # nothing to checkpoint: the interval starts over
            self._last = time.monotonic()
        return pending > 0

    def _until_interval(self) -> float | None:
        if self._policy.interval_s is None:
            return None
        return max(0.0, self._last + self._policy.interval_s - time.monotonic())

    def _run(self) -> None:
        retry_s: float | None = None
        busy_since: float | None = None
        while True:
            if retry_s is not None:  # after a failure, wait it out whatever the log does
                if self._closed.wait(retry_s):
                    return
            else:
                self._wake.wait(self._until_interval())
            if self._closed.is_set():
                return
            self._wake.clear()
            if not self._due():  # e.g. a cluster checkpoint moved the log's base meanwhile
                if retry_s is not None:
                    self._report(None)  # nothing is owed any more
                retry_s = busy_since = None
                continue
            try:
                self.checkpoint()
            except CheckpointStateError as busy:
                busy_since = busy_since or time.monotonic()
                log.info("automatic checkpoint deferred: %s", busy)
                if time.monotonic() - busy_since > BUSY_REPORT_S:
                    self._report(
                        f"no automatic checkpoint for {BUSY_REPORT_S:g} s: another checkpoint "
                        f"holds the shard ({busy}); the log grows meanwhile "
                        f"({self._log.bytes_since_base} bytes since the last checkpoint)"
                    )
                retry_s = BUSY_RETRY_S
                continue
            except ShardFailedError:
                return  # the shard serves nothing more; its fault says why
            except Exception as error:  # noqa: BLE001 - reported, retried, never silent
                busy_since = None
                self.failed += 1
                retry_s = min(2 * retry_s, LAST_RETRY_S) if retry_s else FIRST_RETRY_S
                reason = (
                    f"automatic checkpoint into {self.directory} failed ({error}); the log "
                    f"keeps every write ({self._log.bytes_since_base} bytes since the last "
                    f"checkpoint, past its bound); retrying in {retry_s:g} s"
                )
                log.error("%s", reason)
                self._report(reason)
                continue
            self.taken += 1
            self._last = time.monotonic()
            retry_s = busy_since = None
            self._report(None)
            try:
                self.prune()
            except Exception as error:  # noqa: BLE001 - old checkpoints stay; nothing is lost
                log.warning("pruning the automatic checkpoints in %s: %s", self.directory, error)
