"""The CUDA sources, staged as a CUDA build stages them, compile (kernels with nvcc -c, their
ops with the host compiler on nvcc's include paths), and every launcher an op calls is
defined once, even where no GPU or CUDA torch exists."""

import shutil

import pytest
from ember.kernels.loader import CUDA_SOURCES
from ember.kernels.nvcc_check import compile_check, symbol_problems


@pytest.mark.timeout(900)  # four small nvcc runs and five host compiles over ATen: ~50 s on 2 cores
def test_every_cuda_source_compiles_and_every_launcher_an_op_calls_is_defined_once(tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed here; the CUDA sources are compile-checked where it is")
    results = compile_check(tmp_path)
    failed = {name: errors for name, errors in results.items() if errors}
    assert not failed, failed
    assert sorted(p.name for p in tmp_path.glob("*.o")) == sorted(f"{n}.o" for n in CUDA_SOURCES)
    assert symbol_problems(tmp_path) == []
