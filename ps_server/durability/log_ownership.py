"""Who may write a shard's write-ahead log: one process per shard, of the log's shard count.

A shard's log directory may be shared by the shards of a host. :func:`lock_shard_log`
takes ``shard-S.lock`` (an ``flock``, released when its holder dies or closes it) and
writes the holder's pid and host into it, so a second process is told whose it is.
:func:`check_shard_count` refuses a directory that holds logs or a checkpoint base of
another shard count: serving over them would lose their writes.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import socket
from pathlib import Path
from typing import TextIO

from ember.ps_server.errors import TopologyMismatchError, WriteLogLockedError

_FILE_OF_SHARD = re.compile(r"^shard-(\d+)-of-(\d+)\.(?:\d{8}\.wal|base\.json)$")


def lock_shard_log(directory: Path, shard: int) -> TextIO:
    """Hold shard ``shard``'s log in ``directory`` until the returned file is closed.

    Raises:
        WriteLogLockedError: a live process holds it (its pid and host are named).
    """
    path = directory / f"shard-{shard}.lock"
    handle = open(path, "a+")  # noqa: SIM115 - the caller holds it
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
            f"the write-ahead log of shard {shard} in {directory} is in use by "
            f"{holder}; one shard process per log (stop the other one first)"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on host {socket.gethostname()}\n")
    handle.flush()
    return handle


def check_shard_count(directory: Path, shard: int, num_shards: int) -> None:
    """Refuse ``directory`` if it holds log files of a shard count other than ``num_shards``.

    Raises:
        TopologyMismatchError: naming the files and how to change the shard count.
    """
    others = sorted(
        entry.name
        for entry in directory.iterdir()
        if (match := _FILE_OF_SHARD.match(entry.name)) and int(match.group(2)) != num_shards
    )
    if others:
        raise TopologyMismatchError(
            f"{directory} holds the write-ahead log of another shard count "
            f"({', '.join(others[:4])}{', ...' if len(others) > 4 else ''}), and this is "
            f"shard {shard} of {num_shards}: serving would lose those writes. "
            "To change the shard count: start the old shards on this log, take a checkpoint "
            "(ember checkpoint --dir D), stop them, move this directory aside, then start "
            "the new shards with --restore D and an empty --wal directory"
        )
