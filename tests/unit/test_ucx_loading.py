"""Loading UCX: without a binding, asking for UCX says what to install; with one, Ember's
defaults for UCX's environment fill only what the environment leaves unset."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from ember.ps_server import ucx

_TOUCHED = (*ucx._ENVIRONMENT, *ucx._TCP_ONLY_ENVIRONMENT, "UCX_TLS")


@pytest.fixture
def no_binding(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No UCX binding loads; the variables load_ucx reads or writes start unset and are
    restored afterwards (monkeypatch does not undo a delenv of an unset name)."""
    monkeypatch.setattr(ucx, "_BINDINGS", ("ember_no_such_ucx_binding",))
    saved = {name: os.environ.pop(name, None) for name in _TOUCHED}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def test_no_binding_is_a_clear_error_naming_the_extra(no_binding: None) -> None:
    with pytest.raises(ucx.UcxUnavailableError) as missing:
        ucx.load_ucx()
    assert "pip install 'ember-ps[ucx]'" in str(missing.value)
    assert "ember_no_such_ucx_binding" in str(missing.value)


@pytest.mark.parametrize(
    ("transports", "scheme"),
    [("tcp", "put_zcopy"), (" TCP ", "put_zcopy"), ("rc,sm,self", None), (None, None)],
    ids=["tcp", "tcp-spelled-loosely", "rdma", "unset"],
)
def test_rendezvous_by_put_is_the_default_over_tcp_alone(
    no_binding: None, transports: str | None, scheme: str | None
) -> None:
    """Over TCP alone the rendezvous puts (3x less CPU per byte than UCX's default here);
    with RDMA transports, or transports UCX picks itself, UCX's own default stays."""
    if transports is not None:
        os.environ["UCX_TLS"] = transports
    with pytest.raises(ucx.UcxUnavailableError):
        ucx.load_ucx()
    assert os.environ.get("UCX_RNDV_SCHEME") == scheme
    assert os.environ["UCXPY_ENABLE_PYTHON_FUTURE"] == "1"


def test_what_the_environment_sets_is_kept(no_binding: None) -> None:
    os.environ.update(UCX_TLS="tcp", UCX_RNDV_SCHEME="get_zcopy", UCXPY_ENABLE_PYTHON_FUTURE="0")
    with pytest.raises(ucx.UcxUnavailableError):
        ucx.load_ucx()
    assert os.environ["UCX_RNDV_SCHEME"] == "get_zcopy"
    assert os.environ["UCXPY_ENABLE_PYTHON_FUTURE"] == "0"


def test_the_defaults_are_set_before_the_binding_is_imported(
    no_binding: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """UCX reads its environment when the binding starts it: the defaults must be in place
    by the time the binding's module is imported."""
    seen: dict[str, str | None] = {}

    def recording_import(name: str) -> None:
        seen.update(
            {key: os.environ.get(key) for key in ("UCX_RNDV_SCHEME", "UCXPY_ENABLE_PYTHON_FUTURE")}
        )
        raise ImportError(f"no module named {name!r}")

    monkeypatch.setattr(ucx.importlib, "import_module", recording_import)
    os.environ["UCX_TLS"] = "tcp"
    with pytest.raises(ucx.UcxUnavailableError):
        ucx.load_ucx()
    assert seen == {"UCX_RNDV_SCHEME": "put_zcopy", "UCXPY_ENABLE_PYTHON_FUTURE": "1"}
