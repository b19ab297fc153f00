"""Without a UCX binding, asking for UCX says what to install."""

from __future__ import annotations

import pytest
from ember.ps_server import ucx


def test_no_binding_is_a_clear_error_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ucx, "_BINDINGS", ("ember_no_such_ucx_binding",))
    with pytest.raises(ucx.UcxUnavailableError) as missing:
        ucx.load_ucx()
    assert "pip install 'ember-ps[ucx]'" in str(missing.value)
    assert "ember_no_such_ucx_binding" in str(missing.value)
