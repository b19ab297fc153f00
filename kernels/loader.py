"""The one loader of Ember's native ops (``torch.ops.ember.*``).

Sources under ``kernels/csrc`` (C++) and, where torch has CUDA and a GPU is
present, ``kernels/cuda`` (.cu kernels, and the .cpp ops that check tensors
and launch them) are compiled with ``torch.utils.cpp_extension`` on first use
into one library, in a build directory keyed by a hash of the
sources' contents and the torch version. The sources are copied into that
directory and compiled from there, so the same sources never rebuild, whether
they come from another checkout or a reinstalled package with fresh file
times (concurrent processes wait on the build's lock). Nothing is built or
loaded at import time. Op wrappers ask :func:`native_backend_for` per tensor
device.

``EMBER_KERNELS`` chooses the backend: ``auto`` (default: native when it
builds, else the pure-Python reference, with one log line saying which),
``native`` (fail if it cannot build) or ``reference`` (never build).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from ember.env import env_value

log = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().parent / "csrc"
CUDA_SRC = Path(__file__).resolve().parent / "cuda"
CPU_SOURCES = (
    "hash_map.cpp",
    "rows.cpp",
    "unique.cpp",
    "optim.cpp",
    "pack.cpp",
    "route.cpp",
    "init.cpp",
    "table_update.cpp",
    "split.cpp",
)
# The kernels (.cu, compiled by nvcc, ATen-free) and the ops that check tensors and launch
# them (.cpp, compiled by the host compiler with the CUDA headers).
CUDA_SOURCES = (
    "hash_map.cu",
    "rows.cu",
    "optim.cu",
    "pack.cu",
    "hash_map_ops.cpp",
    "rows_ops.cpp",
    "unique_ops.cpp",
    "optim_ops.cpp",
    "pack_ops.cpp",
)
HEADERS = (
    *(
        CSRC / name
        for name in (
            "checks.h",
            "device_common.h",
            "hash_map.h",
            "init_rows.h",
            "optim_step.h",
            "prefetch.h",
        )
    ),
    *(CUDA_SRC / name for name in ("cuda_checks.h", "launch_geometry.cuh", "launchers.h")),
)
OPS = (
    "hash_find",
    "hash_insert",
    "hash_erase",
    "hash_gather_rows",
    "hash_gather_joined",
    "unique_inverse",
    "plan_features",
    "gather_rows",
    "scatter_rows",
    "scatter_add_rows",
    "fused_row_update",
    "pack_rows",
    "unpack_rows",
    "shard_of",
    "uniform_rows",
    "initial_rows_at",
    "upsert_row_updates",
    "split_tables",
)
# Host-side ops (the shard's and the client's data path, the trainer's per-step bookkeeping):
# CPU only, no CUDA kernel; their wrappers use torch on a device.
CPU_ONLY_OPS = (
    "hash_gather_rows",
    "hash_gather_joined",
    "shard_of",
    "uniform_rows",
    "initial_rows_at",
    "upsert_row_updates",
    "plan_features",
    "split_tables",
)
MODES = ("auto", "native", "reference")


class KernelBuildError(RuntimeError):
    """EMBER_KERNELS=native but the native ops could not be built or loaded."""


def kernel_mode() -> str:
    """The requested backend: EMBER_KERNELS, one of auto, native, reference."""
    mode = env_value("KERNELS", "auto").lower()
    if mode not in MODES:
        raise ValueError(f"EMBER_KERNELS must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def cuda_build_wanted() -> bool:
    """Whether the CUDA sources join the build: torch has CUDA and sees a GPU."""
    return bool(torch.version.cuda) and torch.cuda.is_available()


def source_paths(with_cuda: bool) -> list[Path]:
    """The files compiled (headers excluded) for a CPU or a CPU+CUDA build."""
    paths = [CSRC / name for name in CPU_SOURCES]
    return paths + ([CUDA_SRC / name for name in CUDA_SOURCES] if with_cuda else [])


def build_directory(with_cuda: bool | None = None) -> Path:
    """Where the ops are built: EMBER_KERNELS_CACHE or ~/.cache/ember/kernels, keyed by a hash
    of the torch version and installation and the names and contents of the sources and
    headers. (Two environments with the same torch version write different include paths
    into the build file: sharing one directory, each would rebuild everything on every
    load the other made.)"""
    with_cuda = cuda_build_wanted() if with_cuda is None else with_cuda
    digest = hashlib.sha256(torch.__version__.encode())
    digest.update(str(Path(torch.__file__).resolve().parent).encode() + b"\0")
    for path in [*source_paths(with_cuda), *HEADERS]:
        digest.update(path.name.encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    root = Path(env_value("KERNELS_CACHE", str(Path.home() / ".cache" / "ember" / "kernels")))
    return root / f"{'cuda' if with_cuda else 'cpu'}-{digest.hexdigest()[:16]}"


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
    log.info("ember kernels: native %s backend", "CPU+CUDA" if cuda_build_wanted() else "CPU")
    return True


_reference_forced = False


@contextlib.contextmanager
def reference_backend() -> Iterator[None]:
    """Inside the block every op wrapper runs its pure-torch reference (for comparisons)."""
    global _reference_forced
    previous, _reference_forced = _reference_forced, True
    try:
        yield
    finally:
        _reference_forced = previous


def native_backend_for(tensor: torch.Tensor) -> bool:
    """Whether the native ops serve tensors on ``tensor``'s device (else the reference does)."""
    if _reference_forced:
        return False
    kind = tensor.device.type
    if kind == "cpu":
        return native_ops_available()
    return kind == "cuda" and cuda_build_wanted() and native_ops_available()


def _build_and_load() -> None:
    from torch.utils import cpp_extension

    with_cuda = cuda_build_wanted()
    directory = build_directory(with_cuda)
    directory.mkdir(parents=True, exist_ok=True)
    # torch's own build lock is a plain file that a builder killed mid-build leaves behind,
    # stalling every later load. An flock dies with its holder: under it, a torch lock file
    # can only be stale.
    with open(directory / "ember.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        (directory / "lock").unlink(missing_ok=True)
        sources = stage_sources(directory / "src", with_cuda)
        cpp_extension.load(
            name="ember_kernels_cuda" if with_cuda else "ember_kernels_cpu",
            sources=[str(path) for path in sources],
            build_directory=str(directory),
            # Fuse multiply-adds only where asked; sqrt never sets errno, so it vectorises.
            extra_cflags=["-O3", "-ffp-contract=off", "-fno-math-errno"],
            extra_cuda_cflags=["-O3", f"-I{directory / 'src'}"],
            extra_include_paths=[str(directory / "src")],
            is_python_module=False,
            verbose=os.environ.get("EMBER_KERNELS_VERBOSE") == "1",
        )


def stage_sources(staging: Path, with_cuda: bool) -> list[Path]:
    """Copy the sources and headers into ``staging`` (a file already there with the same
    bytes is kept, file time and all, so ninja sees nothing new); returns the sources."""
    staging.mkdir(exist_ok=True)
    staged = []
    for path in [*source_paths(with_cuda), *HEADERS]:
        target = staging / path.name
        data = path.read_bytes()
        if not target.is_file() or target.read_bytes() != data:
            partial = target.with_name(target.name + ".partial")
            partial.write_bytes(data)
            os.replace(partial, target)
        staged.append(target)
    return staged[: len(source_paths(with_cuda))]
