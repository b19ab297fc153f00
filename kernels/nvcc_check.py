"""Compile check of the CUDA sources with ``nvcc -c``: no GPU or CUDA build of torch needed.

A CPU build of torch ships the ATen and c10 CUDA headers but not the generated
``cuda_cmake_macros.h``; the check defines ``C10_CUDA_NO_CMAKE_CONFIGURE_FILE``
to skip it. Sources are compiled in parallel into a scratch folder.

An object that compiled is kept under the kernels cache, keyed by everything
the compile reads: nvcc's and the host compiler's versions, the command line
and nvcc's flag variables, torch's version and installation, the source and
every Ember header. A later check with the same key copies it
instead of compiling again (as ccache does); anything changed compiles anew.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ember.kernels.loader import CSRC, CUDA_SOURCES, CUDA_SRC

from ember.env import env_value


def nvcc_command(nvcc: str, source: Path, output: Path) -> list[str]:
    """The ``nvcc -c`` command line for one source."""
    from torch.utils.cpp_extension import include_paths

    includes = [f"-I{path}" for path in [*include_paths(), str(CSRC)]]
    return [
        nvcc, "-c", "-std=c++20", "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE",
        *includes, str(source), "-o", str(output),
    ]  # fmt: skip


def compile_check(scratch: Path, jobs: int = 2, timeout_s: float = 600) -> dict[str, str]:
    """Compile every .cu source; ``{source: ""}`` when it compiled, else nvcc's errors.

    Raises:
        FileNotFoundError: no ``nvcc`` on PATH.
    """
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc is not on PATH")

    versions = "".join(
        subprocess.run(
            [tool, "--version"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
        for tool in (nvcc, os.environ.get("NVCC_CCBIN") or shutil.which("c++") or "c++")
    )

    def compile_one(name: str) -> tuple[str, str]:
        output = scratch / f"{name}.o"
        command = nvcc_command(nvcc, CUDA_SRC / name, output)
        cached = _cache_path(versions, command, CUDA_SRC / name)
        if cached.exists():
            shutil.copyfile(cached, output)
            return name, ""
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        if result.returncode == 0:
            _keep(output, cached)
            return name, ""
        errors = [line for line in result.stderr.splitlines() if "error" in line]
        return name, "\n".join(errors) or result.stderr[-2000:]

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return dict(pool.map(compile_one, CUDA_SOURCES))


def _cache_path(versions: str, command: list[str], source: Path) -> Path:
    """Where the object of ``command`` is kept, named by a hash of all the compile reads."""
    import torch

    digest = hashlib.sha256(
        versions.encode() + torch.__version__.encode() + torch.__file__.encode()
    )
    flags = [arg for arg in command if arg not in (str(source), "-o") and not arg.endswith(".o")]
    nvcc_variables = [os.environ.get(v, "") for v in ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS")]
    digest.update("\0".join([*flags, *nvcc_variables]).encode())
    headers = sorted([*CSRC.glob("*.h"), *CUDA_SRC.glob("*.cuh")])
    for path in [source, *headers]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    root = Path(env_value("KERNELS_CACHE", str(Path.home() / ".cache" / "ember" / "kernels")))
    return root / "nvcc-check" / f"{source.name}-{digest.hexdigest()[:24]}.o"


def _keep(output: Path, cached: Path) -> None:
    """Copy ``output`` to ``cached`` atomically (a concurrent reader sees all of it or none)."""
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
    shutil.copyfile(output, partial)
    os.replace(partial, cached)
