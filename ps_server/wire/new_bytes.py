"""Replies built in place: a new ``bytes`` object filled through a writable view.

gRPC sends only ``bytes``, and joining a reply's parts into one copies every
row once more. The C API's way to build a bytes object is to allocate it
uninitialised (``PyBytes_FromStringAndSize(NULL, n)``) and fill it before
anything else holds it; :func:`fill_new_bytes` does that, so the rows of a
reply are gathered straight into the bytes that go on the wire.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_new_bytes.restype = ctypes.py_object
_new_bytes.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)
_bytes_address = ctypes.pythonapi.PyBytes_AsString
_bytes_address.restype = ctypes.c_void_p
_bytes_address.argtypes = (ctypes.py_object,)
_writable_view = ctypes.pythonapi.PyMemoryView_FromMemory
_writable_view.restype = ctypes.py_object
_writable_view.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
_PYBUF_WRITE = 0x200

# Below this a copy is cheaper than the calls (and CPython shares the empty bytes object).
_IN_PLACE_BYTES = 4096


def fill_new_bytes(size: int, fill: Callable[[memoryview], None]) -> bytes:
    """A new ``bytes`` of ``size`` bytes, every one written by ``fill`` through the writable
    view it is given. ``fill`` must write all of them and keep no reference to the view;
    if it raises, the object is dropped and the error goes on."""
    if size < _IN_PLACE_BYTES:
        buffer = bytearray(size)
        fill(memoryview(buffer))
        return bytes(buffer)
    data = _new_bytes(None, size)
    view = _writable_view(_bytes_address(data), size, _PYBUF_WRITE)
    try:
        fill(view)
    finally:
        view.release()  # the view holds no reference to ``data``: it ends here
    return data
