"""``ember doctor``: which backend each native op uses, the compiler and CUDA status."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import platform
import shutil
import subprocess
import sys


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``doctor`` subcommand."""
    parser = commands.add_parser(
        "doctor", help="report native-op backends, compiler and CUDA status"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Print the report. Exit status 1 when EMBER_KERNELS=native and the native ops are
    missing (the build failed), else 0: under ``auto`` the reference serves instead."""
    import torch

    from ember.kernels.loader import (
        CPU_ONLY_OPS,
        OPS,
        KernelBuildError,
        build_directory,
        cuda_build_wanted,
        kernel_mode,
        native_ops_available,
    )

    mode = kernel_mode()
    failure = None
    try:
        native = native_ops_available()
    except KernelBuildError as error:
        native, failure = False, error
    cuda_ops = native and cuda_build_wanted()
    print(f"python {platform.python_version()}  torch {torch.__version__}")
    print(f"EMBER_KERNELS={mode}  build directory {build_directory()}")
    print(f"c++ compiler: {_version('c++')}")
    print(f"nvcc: {_version('nvcc')}")
    cuda = torch.cuda.is_available()
    print(f"CUDA: {'available, ' + torch.cuda.get_device_name(0) if cuda else 'not available'}"
          f" (torch built with CUDA {torch.version.cuda or 'none'})")  # fmt: skip
    print(f"UCX: {_ucx_binding()}")
    missing = []
    width = max(map(len, OPS))
    for op in OPS:
        loaded = native and hasattr(torch.ops.ember, op)
        if native and not loaded:
            missing.append(op)
        cpu = "native" if loaded else "reference (torch)"
        gpu = "native" if loaded and cuda_ops else "reference (torch)"
        if op in CPU_ONLY_OPS:
            gpu = "- (host-side op)"
        print(f"  {op:<{width}} CPU: {cpu:<18} CUDA: {gpu}")
    if failure is None and missing and mode == "native":
        failure = f"the library built but lacks {', '.join(missing)}"
    if failure is not None:
        print(f"ember doctor: the native ops are required (EMBER_KERNELS=native) but missing: "
              f"{failure}", file=sys.stderr)  # fmt: skip
        return 1
    return 0


def _ucx_binding() -> str:
    """The UCX binding ``ember ps --ucx`` would load, found without importing it."""
    for module, distribution in (("ucp", "ucx-py"), ("ucxx", "ucxx")):
        if importlib.util.find_spec(module) is not None:
            versions = [
                f"{d.metadata['Name']} {d.version}"
                for d in importlib.metadata.distributions()
                if (d.metadata["Name"] or "").startswith(distribution)
            ]
            return f"{module} ({', '.join(versions) or 'version unknown'})"
    return "not installed (pip install 'ember-ps[ucx]')"


def _version(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        return "not found"
    try:
        output = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{path} (no version: {error})"
    lines = [line for line in output.stdout.splitlines() if line.strip()]
    return f"{path}: {lines[-1] if tool == 'nvcc' and lines else (lines[0] if lines else '?')}"
