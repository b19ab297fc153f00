"""The CUDA sources compile (nvcc -c), even where no GPU or CUDA torch exists."""

import shutil

import pytest
from ember.kernels.nvcc_check import compile_check


@pytest.mark.timeout(900)  # five nvcc runs over the ATen headers: ~120 s on 2 idle cores
def test_every_cuda_source_compiles_with_nvcc(tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed here; the CUDA sources are compile-checked where it is")
    results = compile_check(tmp_path)
    failed = {name: errors for name, errors in results.items() if errors}
    assert not failed, failed
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{name}.o" for name in results)
