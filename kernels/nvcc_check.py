"""Compile check of the CUDA sources: no GPU or CUDA build of torch needed.

The sources and headers are staged flat into one folder as the loader stages
them for a CUDA build (:func:`ember.kernels.loader.stage_sources`), so a file
the build would miss fails here too. The kernels (.cu) compile with ``nvcc
-c``; the ops that check tensors and launch them (.cpp) with torch's host
compiler, on the include paths nvcc itself uses. Then
:func:`symbol_problems` checks the objects as loading the library would: every
symbol of namespace ``ember`` that one object calls is defined by another
(each launcher with its exact signature), and none is defined twice.

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
import re
import shlex
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ember.kernels.loader import CUDA_SOURCES, CUDA_SRC, HEADERS, stage_sources

from ember.env import env_value

_FLAGS = ("-std=c++20", "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE")
_EMBER_SYMBOL = "_ZN5ember"  # the mangled prefix of every name in namespace ember
_LAUNCHER = re.compile(r"\bvoid\s+(launch_\w+)\s*\(")


def _includes(staging: Path) -> list[str]:
    from torch.utils.cpp_extension import include_paths

    return [f"-I{path}" for path in [*include_paths(), str(staging)]]


def nvcc_command(nvcc: str, staging: Path, source: Path, output: Path) -> list[str]:
    """The ``nvcc -c`` command line for one staged kernel source."""
    return [nvcc, "-c", *_FLAGS, *_includes(staging), str(source), "-o", str(output)]


def host_command(
    compiler: str, cuda_includes: list[str], staging: Path, source: Path, output: Path
) -> list[str]:
    """The host compiler's command line for one staged op source, with nvcc's include paths."""
    return [
        compiler, "-c", "-fPIC", *_FLAGS, *_includes(staging), *cuda_includes,
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
    """Stage the CUDA build's sources into ``scratch / "src"`` and compile each into
    ``scratch`` (``hash_map.cu.o``, ...); ``{source: ""}`` when it compiled, else the
    compiler's errors.

    Raises:
        FileNotFoundError: no ``nvcc`` on PATH.
        RuntimeError: ``nvcc --dryrun`` named no include paths.
    """
    from torch.utils.cpp_extension import get_cxx_compiler

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc is not on PATH")
    host = get_cxx_compiler()  # what a CUDA build compiles the ops with
    tools = [nvcc, host, *filter(None, [os.environ.get("NVCC_CCBIN")])]  # NVCC_CCBIN: nvcc's host
    versions = "".join(
        subprocess.run(
            [tool, "--version"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
        for tool in tools
    )
    cuda_includes = nvcc_include_paths(nvcc)
    staging = scratch / "src"
    staged = {path.name: path for path in stage_sources(staging, with_cuda=True)}

    def compile_one(name: str) -> tuple[str, str]:
        output, source = scratch / f"{name}.o", staged[name]
        if source.suffix == ".cu":
            command = nvcc_command(nvcc, staging, source, output)
        else:
            command = host_command(host, cuda_includes, staging, source, output)
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


def symbol_problems(scratch: Path) -> list[str]:
    """What would keep the CUDA objects compiled into ``scratch`` from loading as one
    library (empty: nothing), for names of namespace ``ember``: a call that no object
    defines, a definition in two objects, or a launcher declared in launchers.h that no
    op calls."""
    objects = [scratch / f"{name}.o" for name in CUDA_SOURCES]
    missing = [path.name for path in objects if not path.is_file()]
    if missing:
        return [f"not compiled: {', '.join(missing)}"]
    undefined, defined_in = set(), {}
    for path in objects:
        for name, kind in _ember_symbols(path):
            if kind == "U":
                undefined.add(name)
            elif kind in "TDBR":  # a strong definition (weak ones may repeat)
                defined_in.setdefault(name, []).append(path.name)
    cpp = _demangled([*undefined, *defined_in])
    problems = [f"{cpp[name]} is called but defined nowhere"
                for name in sorted(undefined - defined_in.keys())]  # fmt: skip
    problems += [f"{cpp[name]} is defined in {' and '.join(where)}"
                 for name, where in sorted(defined_in.items()) if len(where) > 1]  # fmt: skip
    called = {cpp[name].split("(")[0] for name in undefined}
    declared = set(_LAUNCHER.findall((CUDA_SRC / "launchers.h").read_text()))
    problems += [f"ember::{name} is declared but no op calls it"
                 for name in sorted(declared - {c.removeprefix("ember::") for c in called})]  # fmt: skip
    return problems


def _ember_symbols(path: Path) -> list[tuple[str, str]]:
    """``(mangled name, nm's type letter)`` of ``path``'s external symbols in namespace
    ``ember`` (POSIX ``nm -P`` output)."""
    listing = subprocess.run(
        ["nm", "-P", "-g", str(path)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    fields = (line.split() for line in listing.splitlines())
    return [(f[0], f[1]) for f in fields if len(f) >= 2 and f[0].startswith(_EMBER_SYMBOL)]


def _demangled(names: list[str]) -> dict[str, str]:
    """Each mangled name as C++ spells it (one ``c++filt`` run), or as it is where
    ``c++filt`` is missing or fails."""
    try:
        lines = subprocess.run(
            ["c++filt"], input="\n".join(names), capture_output=True, text=True, timeout=60,
            check=True,
        ).stdout.splitlines()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        lines = []
    return dict(zip(names, lines)) if len(lines) == len(names) else {n: n for n in names}


def _cache_path(versions: str, command: list[str], source: Path) -> Path:
    """Where the object of ``command`` is kept, named by a hash of all the compile reads."""
    import torch

    digest = hashlib.sha256(
        versions.encode() + torch.__version__.encode() + torch.__file__.encode()
    )
    staging = str(source.parent)  # a fresh folder each check: the key names it by its role
    flags = [
        arg.replace(staging, "<staged>")
        for arg in command
        if arg not in (str(source), "-o") and not arg.endswith(".o")
    ]
    nvcc_variables = [os.environ.get(v, "") for v in ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS")]
    digest.update("\0".join([*flags, *nvcc_variables]).encode())
    for path in [source, *HEADERS]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    root = Path(env_value("KERNELS_CACHE", str(Path.home() / ".cache" / "ember" / "kernels")))
    return root / "nvcc-check" / f"{source.name}-{digest.hexdigest()[:24]}.o"


def _keep(output: Path, cached: Path) -> None:
    """Copy ``output`` to ``cached`` atomically (a concurrent reader sees all of it or none)."""
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
    shutil.copyfile(output, partial)
    os.replace(partial, cached)
