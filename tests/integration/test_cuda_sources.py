"""The CUDA sources compile (kernels with nvcc -c, their ops with the host compiler on
nvcc's include paths) and their objects link, even where no GPU or CUDA torch exists."""

import shutil

import pytest
from ember.kernels.loader import CUDA_SOURCES
from ember.kernels.nvcc_check import compile_check, unresolved_launchers


@pytest.mark.timeout(900)  # four small nvcc runs and five host compiles over ATen: ~60 s on 2 cores
def test_every_cuda_source_compiles_and_every_launcher_an_op_calls_is_defined(tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed here; the CUDA sources are compile-checked where it is")
    results = compile_check(tmp_path)
    failed = {name: errors for name, errors in results.items() if errors}
    assert not failed, failed
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{name}.o" for name in CUDA_SOURCES
    )
    assert not unresolved_launchers(tmp_path)
