"""Without a UCX binding, asking for UCX says what to install."""

from __future__ import annotations

import os

import pytest
from ember.ps_server import ucx


def test_no_binding_is_a_clear_error_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ucx, "_BINDINGS", ("ember_no_such_ucx_binding",))
    with pytest.raises(ucx.UcxUnavailableError) as missing:
        ucx.load_ucx()
    assert "pip install 'ember-ps[ucx]'" in str(missing.value)
    assert "ember_no_such_ucx_binding" in str(missing.value)


def test_loading_sets_ember_defaults_and_keeps_what_the_user_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Python futures for completions and 256 KiB TCP segments, unless the environment says
    otherwise (the variables must be set before UCX reads them, on load)."""
    monkeypatch.setattr(ucx, "_BINDINGS", ("ember_no_such_ucx_binding",))
    for name in ("UCXPY_ENABLE_PYTHON_FUTURE", "UCX_TCP_TX_SEG_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("UCX_TCP_RX_SEG_SIZE", "64K")
    with pytest.raises(ucx.UcxUnavailableError):
        ucx.load_ucx()
    assert os.environ["UCXPY_ENABLE_PYTHON_FUTURE"] == "1"
    assert os.environ["UCX_TCP_TX_SEG_SIZE"] == "256K"
    assert os.environ["UCX_TCP_RX_SEG_SIZE"] == "64K"
