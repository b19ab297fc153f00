import pytest

from tests.support.native import use_backend


@pytest.fixture(params=["native", "reference"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test once per kernel backend (native skipped, with the reason, if unavailable)."""
    use_backend(request.param, monkeypatch)
    return request.param
