"""The wire contract: generated messages and the packed byte layout.

This is the only module that imports the generated code; everything else
imports ``pb`` (messages) and ``pb_grpc`` (stubs and servicer base) from here.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np
import torch
from ember.ps_server.errors import InvalidArgumentError

from ember.v1 import parameter_server_pb2 as pb
from ember.v1 import parameter_server_pb2_grpc as pb_grpc

__all__ = [
    "RESTARTING_KEY",
    "ROW_BYTES_PER_ELEMENT",
    "SERVICE_NAME",
    "decode_rows",
    "id_view",
    "pb",
    "pb_grpc",
]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ParameterServer"].full_name
ID_DTYPE = np.dtype("<i8")
ROW_DTYPE = np.dtype("<f4")
VERSION_DTYPE = np.dtype("<i8")
ROW_BYTES_PER_ELEMENT = ROW_DTYPE.itemsize
# Trailing metadata beside an UNAVAILABLE status: the shard is restarting (it exits for its
# supervisor, or is rebuilding its rows), not gone, so a client waits longer for it.
RESTARTING_KEY = "ember-restarting"
# The default limit on one request or reply, both ways.
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20


def require_little_endian_host() -> None:
    """Refuse to run on a big-endian host: the wire is little-endian and the codecs and
    native gathers lay values out in host order (a shard or client calls this as it starts).

    Raises:
        RuntimeError: the host is big-endian.
    """
    if sys.byteorder != "little":
        raise RuntimeError(
            "Ember's wire format is little-endian and its codecs write values in host order; "
            f"this host is {sys.byteorder}-endian, which Ember does not support"
        )


def id_view(data: bytes | memoryview) -> np.ndarray:
    """View packed little-endian int64 ids as an array without copying (any sign).

    Raises:
        InvalidArgumentError: the length is not a multiple of 8.
    """
    if len(data) % ID_DTYPE.itemsize:
        raise InvalidArgumentError(
            f"ids must be packed little-endian int64: {len(data)} bytes is not a multiple of 8"
        )
    return np.frombuffer(data, dtype=ID_DTYPE)


def decode_rows(data: bytes, num_rows: int, dim: int, what: str) -> np.ndarray:
    """View packed float32 rows as a read-only [num_rows, dim] array.

    Raises:
        InvalidArgumentError: the byte length does not equal num_rows * dim * 4.
    """
    expected = num_rows * dim * ROW_DTYPE.itemsize
    if len(data) != expected:
        raise InvalidArgumentError(
            f"{what} must hold {num_rows} ids x dim {dim} float32 = {expected} bytes, got {len(data)}"
        )
    return np.frombuffer(data, dtype=ROW_DTYPE).reshape(num_rows, dim)


def decode_versions(data: bytes | memoryview, num_rows: int) -> np.ndarray:
    """View packed little-endian int64 versions, one per row.

    Raises:
        InvalidArgumentError: the length is not num_rows * 8.
    """
    if len(data) != num_rows * VERSION_DTYPE.itemsize:
        raise InvalidArgumentError(
            f"versions must hold one int64 per id: {num_rows} ids need {num_rows * 8} bytes, got {len(data)}"
        )
    return np.frombuffer(data, dtype=VERSION_DTYPE)


def encode_ids(ids: np.ndarray) -> bytes:
    """Pack an integer array as little-endian int64 bytes."""
    return np.ascontiguousarray(ids, dtype=ID_DTYPE).tobytes()


def readonly_tensor(buffer: bytes | memoryview, dtype: torch.dtype) -> torch.Tensor:
    """A 1-D tensor viewing ``buffer`` without a copy. Callers must never write to it."""
    if len(buffer) == 0:
        return torch.empty(0, dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns that the buffer is read-only
        return torch.frombuffer(buffer, dtype=dtype)


def message_size_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """gRPC channel/server options raising both message limits to ``max_message_bytes``."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]
