"""``ember ps`` over a disk that fails on demand: run as ``python faulty_disk_shard.py TRIGGER
[ember ps flags]``. Once the file TRIGGER exists, every fsync of a write-ahead log segment
fails with EIO, as a dying disk's would. For tests of the shard's fail-closed behaviour."""

import errno
import os
import sys
from pathlib import Path

from ember.cli.main import main

trigger = Path(sys.argv[1])
real_fsync = os.fsync


def fsync(fd: int) -> None:
    if trigger.exists() and os.readlink(f"/proc/self/fd/{fd}").endswith(".wal"):
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    real_fsync(fd)


os.fsync = fsync
sys.exit(main(["ps", *sys.argv[2:]]))
