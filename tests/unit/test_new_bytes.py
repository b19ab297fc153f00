import pytest
from ember.ps_server.wire.new_bytes import fill_new_bytes


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 1 << 20])
def test_every_byte_comes_from_the_filler(size):
    pattern = bytes(range(251)) * (size // 251 + 1)

    def fill(view):
        assert not view.readonly and len(view) == size
        view[:] = pattern[:size]

    data = fill_new_bytes(size, fill)
    assert type(data) is bytes and data == pattern[:size]


def test_objects_are_new_each_time():
    first = fill_new_bytes(8192, lambda view: view.__setitem__(slice(None), b"a" * 8192))
    second = fill_new_bytes(8192, lambda view: view.__setitem__(slice(None), b"b" * 8192))
    assert first == b"a" * 8192 and second == b"b" * 8192


def test_a_failing_filler_returns_nothing():
    def fill(view):
        raise ValueError("row out of range")

    with pytest.raises(ValueError, match="row out of range"):
        fill_new_bytes(1 << 16, fill)
