"""Compile check of the CUDA sources with ``nvcc -c``: no GPU or CUDA build of torch needed.

A CPU build of torch ships the ATen and c10 CUDA headers but not the generated
``cuda_cmake_macros.h``; the check defines ``C10_CUDA_NO_CMAKE_CONFIGURE_FILE``
to skip it. Sources are compiled in parallel into a scratch folder.
"""

from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ember.kernels.loader import CSRC, CUDA_SOURCES, CUDA_SRC


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

    def compile_one(name: str) -> tuple[str, str]:
        command = nvcc_command(nvcc, CUDA_SRC / name, scratch / f"{name}.o")
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        errors = [line for line in result.stderr.splitlines() if "error" in line]
        return name, "" if result.returncode == 0 else "\n".join(errors) or result.stderr[-2000:]

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return dict(pool.map(compile_one, CUDA_SOURCES))
