"""Compile check of the CUDA sources: no GPU or CUDA build of torch needed.

The kernels (.cu) compile with ``nvcc -c``; the ops that check tensors and
launch them (.cpp) compile with the host compiler, on the include paths nvcc
itself uses. Then every launcher the ops call must be defined, with the same
signature, by a kernel object: :func:`unresolved_launchers` compares their
symbols, as the linker of a CUDA build would.

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
import shlex
import shutil
import subprocess
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ember.kernels.loader import CSRC, CUDA_SOURCES, CUDA_SRC

from ember.env import env_value

_FLAGS = ("-std=c++20", "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE")
_EMBER_SYMBOL = "_ZN5ember"  # the mangled prefix of every name in namespace ember


def _torch_includes() -> list[str]:
    from torch.utils.cpp_extension import include_paths

    return [f"-I{path}" for path in [*include_paths(), str(CSRC), str(CUDA_SRC)]]


def nvcc_command(nvcc: str, source: Path, output: Path) -> list[str]:
    """The ``nvcc -c`` command line for one kernel source."""
    return [nvcc, "-c", *_FLAGS, *_torch_includes(), str(source), "-o", str(output)]


def host_command(compiler: str, cuda_includes: list[str], source: Path, output: Path) -> list[str]:
    """The host compiler's command line for one op source, with nvcc's include paths."""
    return [
        compiler, "-c", "-fPIC", *_FLAGS, *_torch_includes(), *cuda_includes,
        str(source), "-o", str(output),
    ]  # fmt: skip


def nvcc_include_paths(nvcc: str) -> list[str]:
    """The ``-I``/``-isystem`` flags nvcc gives its host compiler (from ``nvcc --dryrun``)."""
    result = subprocess.run(
        [nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    flags = []
    for line in result.stderr.splitlines():
        for variable in ("INCLUDES=", "SYSTEM_INCLUDES="):
            if line.startswith(f"#$ {variable}"):
                flags += shlex.split(line.removeprefix(f"#$ {variable}"))
    if not flags:
        raise RuntimeError(f"nvcc --dryrun named no include paths:\n{result.stderr[-2000:]}")
    return flags


def compile_check(scratch: Path, jobs: int = 2, timeout_s: float = 600) -> dict[str, str]:
    """Compile every CUDA source into ``scratch`` (``hash_map.cu.o``, ...); ``{source: ""}`` when it
    compiled, else the compiler's errors.

    Raises:
        FileNotFoundError: no ``nvcc`` on PATH.
    """
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc is not on PATH")
    host = os.environ.get("NVCC_CCBIN") or shutil.which("c++") or "c++"
    versions = "".join(
        subprocess.run(
            [tool, "--version"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
        for tool in (nvcc, host)
    )
    cuda_includes = nvcc_include_paths(nvcc)

    def compile_one(name: str) -> tuple[str, str]:
        output, source = scratch / f"{name}.o", CUDA_SRC / name
        if source.suffix == ".cu":
            command = nvcc_command(nvcc, source, output)
        else:
            command = host_command(host, cuda_includes, source, output)
        cached = _cache_path(versions, command, source)
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


def unresolved_launchers(scratch: Path) -> set[str]:
    """The symbols of namespace ``ember`` that the compiled ops (``*.cpp.o`` in ``scratch``)
    call and no compiled kernel (``*.cu.o``) defines: empty when a CUDA build links."""
    return _symbols(scratch.glob("*.cpp.o"), "--undefined-only") - _symbols(
        scratch.glob("*.cu.o"), "--defined-only"
    )


def _symbols(objects: Iterable[Path], which: str) -> set[str]:
    """The mangled names of namespace ``ember`` that ``nm which`` lists for ``objects``."""
    paths = [str(path) for path in objects]
    if not paths:
        return set()
    listing = subprocess.run(
        ["nm", which, "--format=just-symbols", *paths],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    return {line.strip() for line in listing.splitlines() if line.startswith(_EMBER_SYMBOL)}


def _cache_path(versions: str, command: list[str], source: Path) -> Path:
    """Where the object of ``command`` is kept, named by a hash of all the compile reads."""
    import torch

    digest = hashlib.sha256(
        versions.encode() + torch.__version__.encode() + torch.__file__.encode()
    )
    flags = [arg for arg in command if arg not in (str(source), "-o") and not arg.endswith(".o")]
    nvcc_variables = [os.environ.get(v, "") for v in ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS")]
    digest.update("\0".join([*flags, *nvcc_variables]).encode())
    headers = sorted([*CSRC.glob("*.h"), *CUDA_SRC.glob("*.cuh"), *CUDA_SRC.glob("*.h")])
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
