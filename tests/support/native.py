"""Choosing the native or the reference backend of the kernels in tests."""

import pytest
from ember.kernels import loader


def require_native() -> None:
    """Skip, saying why, where the native ops are unavailable."""
    if not loader.native_ops_available():
        pytest.skip(
            "native ops unavailable (EMBER_KERNELS=reference, or no C++ toolchain); the reference is tested"
        )


def use_backend(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Route every op wrapper to ``name`` ("native" or "reference") for one test."""
    if name == "native":
        require_native()
    else:
        monkeypatch.setattr(loader, "_reference_forced", True)
