"""Skip helper for tests of the native ops."""

import pytest
from ember.kernels.loader import native_ops_available


def require_native() -> None:
    """Skip, saying why, where the native ops are unavailable."""
    if not native_ops_available():
        pytest.skip(
            "native ops unavailable (EMBER_KERNELS=reference, or no C++ toolchain); the reference is tested"
        )
