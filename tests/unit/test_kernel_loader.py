import os
import shutil

import pytest
from ember.kernels import loader


@pytest.fixture(autouse=True)
def fresh_cache():
    loader.native_ops_available.cache_clear()
    yield
    loader.native_ops_available.cache_clear()


def test_reference_mode_never_builds(monkeypatch, tmp_path):
    monkeypatch.setenv("EMBER_KERNELS", "reference")
    monkeypatch.setenv("EMBER_KERNELS_CACHE", str(tmp_path))
    assert loader.native_ops_available() is False
    assert list(tmp_path.iterdir()) == []


def test_unknown_mode_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("EMBER_KERNELS", "fastest")
    with pytest.raises(ValueError, match="EMBER_KERNELS must be one of auto, native, reference"):
        loader.native_ops_available()


def test_build_directory_is_keyed_by_sources_and_torch(monkeypatch, tmp_path):
    monkeypatch.setenv("EMBER_KERNELS_CACHE", str(tmp_path))
    first = loader.build_directory()
    assert first.parent == tmp_path and first.name.startswith("cpu-")
    assert loader.build_directory() == first
    monkeypatch.setattr(loader.torch, "__version__", "0.0.0-other")
    assert loader.build_directory() != first
    monkeypatch.undo()
    monkeypatch.setenv("EMBER_KERNELS_CACHE", str(tmp_path))
    other_env = tmp_path / "other-venv" / "torch" / "__init__.py"  # same version, elsewhere
    monkeypatch.setattr(loader.torch, "__file__", str(other_env))
    assert loader.build_directory() != first


def test_native_mode_reports_a_failed_build(monkeypatch):
    monkeypatch.setenv("EMBER_KERNELS", "native")

    def broken() -> None:
        raise RuntimeError("no compiler")

    monkeypatch.setattr(loader, "_build_and_load", broken)
    with pytest.raises(loader.KernelBuildError, match="no compiler"):
        loader.native_ops_available()


def test_auto_mode_falls_back_with_one_log_line(monkeypatch, caplog):
    monkeypatch.setenv("EMBER_KERNELS", "auto")
    monkeypatch.setattr(
        loader, "_build_and_load", lambda: (_ for _ in ()).throw(RuntimeError("no compiler"))
    )
    with caplog.at_level("WARNING"):
        assert loader.native_ops_available() is False
    assert [r.message for r in caplog.records] == [
        "ember kernels: reference backend (native build failed: no compiler)"
    ]


def test_a_lock_left_by_a_killed_build_does_not_stall_the_next_load(monkeypatch, tmp_path):
    from torch.utils import cpp_extension

    monkeypatch.setenv("EMBER_KERNELS", "native")
    monkeypatch.setenv("EMBER_KERNELS_CACHE", str(tmp_path))
    directory = loader.build_directory()
    directory.mkdir(parents=True)
    (directory / "lock").touch()  # what a builder killed mid-build leaves
    calls = []

    def fake_load(**kwargs):
        assert not (directory / "lock").exists()
        calls.append(kwargs["build_directory"])

    monkeypatch.setattr(cpp_extension, "load", fake_load)
    assert loader.native_ops_available() is True
    assert calls == [str(directory)]


def _use_sources_in(monkeypatch, root):
    monkeypatch.setattr(loader, "CSRC", root / "csrc")
    monkeypatch.setattr(loader, "CUDA_SRC", root / "cuda")
    monkeypatch.setattr(
        loader, "HEADERS", tuple(root / path.parent.name / path.name for path in loader.HEADERS)
    )


def test_the_same_sources_anywhere_share_one_build_that_only_their_bytes_change(
    monkeypatch, tmp_path
):
    """A reinstalled package or another checkout (new paths, new file times) reuses the build."""
    monkeypatch.setenv("EMBER_KERNELS_CACHE", str(tmp_path / "cache"))
    first = loader.build_directory(with_cuda=True)
    copy = tmp_path / "elsewhere"
    shutil.copytree(loader.CSRC, copy / "csrc")
    shutil.copytree(loader.CUDA_SRC, copy / "cuda")
    _use_sources_in(monkeypatch, copy)
    assert loader.build_directory(with_cuda=True) == first
    (copy / "cuda" / "launchers.h").write_text("// changed\n")  # a header counts too
    assert loader.build_directory(with_cuda=True) != first


def test_staging_keeps_unchanged_sources_untouched_and_replaces_changed_ones(monkeypatch, tmp_path):
    copy = tmp_path / "sources"
    shutil.copytree(loader.CSRC, copy / "csrc")
    shutil.copytree(loader.CUDA_SRC, copy / "cuda")
    _use_sources_in(monkeypatch, copy)
    staging = tmp_path / "staging"
    staged = loader.stage_sources(staging, with_cuda=False)
    assert [path.name for path in staged] == list(loader.CPU_SOURCES)
    assert (staging / "checks.h").read_bytes() == (copy / "csrc" / "checks.h").read_bytes()
    before = {path.name: path.stat().st_mtime_ns for path in staging.iterdir()}
    for path in (copy / "csrc").iterdir():  # a reinstall: same bytes, new file times
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    (copy / "csrc" / "rows.cpp").write_text("// new rows\n")
    loader.stage_sources(staging, with_cuda=False)
    after = {path.name: path.stat().st_mtime_ns for path in staging.iterdir()}
    assert (staging / "rows.cpp").read_text() == "// new rows\n"
    assert {name for name in before if after[name] != before[name]} == {"rows.cpp"}


def test_every_source_and_header_on_disk_is_built_and_staged_under_its_own_name():
    """A file missing from the lists would be left out of the build (a source: its ops never
    registered; a header: the staged build cannot find it); two staged files of one name
    would overwrite each other."""
    on_disk = {p for folder in (loader.CSRC, loader.CUDA_SRC) for p in folder.iterdir()}
    sources = {*loader.source_paths(with_cuda=True)}
    assert {p for p in on_disk if p.suffix in (".cpp", ".cu")} == sources
    assert {p for p in on_disk if p.suffix in (".h", ".cuh")} == set(loader.HEADERS)
    names = [path.name for path in [*sources, *loader.HEADERS]]
    assert len(names) == len(set(names))
