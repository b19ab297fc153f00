"""Which of a shard's automatic checkpoints to keep, and deleting the rest safely.

Kept: the newest ``keep`` finished checkpoints, every base their increments
chain to, and the chain of the checkpoint the write log continues from.
Deleted: the other finished checkpoints, unfinished directories (no
manifest) older than the newest finished one (left by a checkpoint that
failed or was killed), and whatever an interrupted prune was deleting.

Each directory is first renamed out of the checkpoint namespace
(``.deleting-<name>``), the rename made durable, and only then removed, so
a prune killed midway never leaves something that looks like a finished
checkpoint but lacks files. A manifest that cannot be read stops the prune
before anything is deleted: what it needs is unknown.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from ember.ps_server.durability.checkpoint_format import CHECKPOINT_ID, MANIFEST, Manifest
from ember.ps_server.durability.durable_files import fsync_directory

log = logging.getLogger(__name__)

TRASH_PREFIX = ".deleting-"


def prune_checkpoints(directory: Path, keep: int, protected: Sequence[Path] = ()) -> list[str]:
    """Delete the checkpoints under ``directory`` that are not kept (see the module
    docstring); returns the names deleted.

    Args:
        directory: one shard's automatic checkpoints (``ckpt-NNNNNN`` directories).
        keep: finished checkpoints to keep, newest first (>= 1).
        protected: checkpoints kept with their chains whatever their age (the one the
            write log continues from).

    Raises:
        ValueError: ``keep`` < 1.
        DurableFileCorruptError: a kept checkpoint's manifest is unreadable (nothing deleted).
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    numbered = sorted(
        (entry for entry in directory.iterdir() if CHECKPOINT_ID.match(entry.name)),
        key=lambda entry: int(entry.name[5:]),
    )
    finished = [entry for entry in numbered if (entry / MANIFEST).exists()]
    if not finished:
        return []
    needed: set[str] = set()
    for root in [*finished[-keep:], *protected]:
        needed |= _chain_names(root) if root.parent == directory else set()
    newest = int(finished[-1].name[5:])
    doomed = [
        entry
        for entry in numbered
        if entry.name not in needed
        and (entry in finished or int(entry.name[5:]) < newest)  # never one being written
    ]
    for entry in doomed:
        os.replace(entry, entry.with_name(TRASH_PREFIX + entry.name))
    if doomed:
        fsync_directory(directory)
    for trash in directory.glob(TRASH_PREFIX + "*"):
        _delete(trash)
    if doomed:
        log.info("pruned checkpoints %s under %s", [e.name for e in doomed], directory)
    return [entry.name for entry in doomed]


def _delete(trash: Path) -> None:
    """Remove a renamed checkpoint directory (the last step of a prune)."""
    shutil.rmtree(trash)


def _chain_names(checkpoint: Path) -> set[str]:
    """The names of ``checkpoint`` and of every base it chains to (manifests only)."""
    names, current = set(), checkpoint
    while current.name not in names:
        names.add(current.name)
        base = Manifest.load(current).base
        if base is None:
            break
        current = current.parent / base
    return names
