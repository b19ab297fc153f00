"""A small tmpfs for full-disk tests: mounting needs root (skipped, saying why, elsewhere)."""

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def mounted_tmpfs(mount_point: Path, size: str) -> Iterator[Callable[[str], None]]:
    """Mount a tmpfs of ``size`` (``512k``, ``1m``) at the new directory ``mount_point``;
    yields a function that resizes it; unmounts at the end."""
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("a full-disk test mounts a small tmpfs, which needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")

    def resize(new_size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={new_size}", str(mount_point)], check=True)

    try:
        yield resize
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
