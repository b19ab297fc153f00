"""The one loader of Ember's native ops (``torch.ops.ember.*``).

Sources under ``kernels/csrc`` are compiled with ``torch.utils.cpp_extension``
on first use, into a build directory keyed by a hash of the sources and the
torch version, so an unchanged tree never rebuilds (concurrent processes wait
on the build's lock). Nothing is built or loaded at import time.

``EMBER_KERNELS`` chooses the backend: ``auto`` (default: native when it
builds, else the pure-Python reference, with one log line saying which),
``native`` (fail if it cannot build) or ``reference`` (never build).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
from pathlib import Path

import torch

from ember.env import env_value

log = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().parent / "csrc"
CPU_SOURCES = ("hash_map.cpp", "rows.cpp")
MODES = ("auto", "native", "reference")


class KernelBuildError(RuntimeError):
    """EMBER_KERNELS=native but the native ops could not be built or loaded."""


def kernel_mode() -> str:
    """The requested backend: EMBER_KERNELS, one of auto, native, reference."""
    mode = env_value("KERNELS", "auto").lower()
    if mode not in MODES:
        raise ValueError(f"EMBER_KERNELS must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def build_directory() -> Path:
    """Where the ops are built: EMBER_KERNELS_CACHE or ~/.cache/ember/kernels, keyed by a hash
    of the torch version, the source folder (the build files name it) and the sources."""
    digest = hashlib.sha256(torch.__version__.encode())
    digest.update(str(CSRC).encode())
    for name in CPU_SOURCES:
        digest.update(name.encode())
        digest.update((CSRC / name).read_bytes())
    root = Path(env_value("KERNELS_CACHE", str(Path.home() / ".cache" / "ember" / "kernels")))
    return root / f"cpu-{digest.hexdigest()[:16]}"


@functools.lru_cache(maxsize=1)
def native_ops_available() -> bool:
    """Build (once per source hash) and load the CPU ops; False if the reference must serve."""
    mode = kernel_mode()
    if mode == "reference":
        log.info("ember kernels: reference backend (EMBER_KERNELS=reference)")
        return False
    try:
        _build_and_load()
    except Exception as error:
        if mode == "native":
            raise KernelBuildError(f"EMBER_KERNELS=native but the build failed: {error}") from error
        log.warning(
            "ember kernels: reference backend (native build failed: %s)", str(error).splitlines()[0]
        )
        return False
    log.info("ember kernels: native CPU backend")
    return True


def _build_and_load() -> None:
    from torch.utils import cpp_extension

    directory = build_directory()
    directory.mkdir(parents=True, exist_ok=True)
    # torch's own build lock is a plain file that a builder killed mid-build leaves behind,
    # stalling every later load. An flock dies with its holder: under it, a torch lock file
    # can only be stale.
    with open(directory / "ember.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        (directory / "lock").unlink(missing_ok=True)
        cpp_extension.load(
            name="ember_kernels_cpu",
            sources=[str(CSRC / name) for name in CPU_SOURCES],
            build_directory=str(directory),
            extra_cflags=["-O3"],
            is_python_module=False,
            verbose=os.environ.get("EMBER_KERNELS_VERBOSE") == "1",
        )
