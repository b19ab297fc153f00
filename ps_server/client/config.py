"""Typed configuration of a client of the shards."""

from __future__ import annotations

import dataclasses

from ember.ps_server.client.transport import check_transport
from ember.ps_server.wire.messages import DEFAULT_MAX_MESSAGE_BYTES

from ember.env import dataclass_from_env


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    """How a PSClient talks to shards.

    Attributes:
        timeout_s: deadline of each RPC.
        max_attempts: tries per RPC when a shard is UNAVAILABLE (1 = no retry).
        initial_backoff_s: wait before the first retry; doubles each retry.
        max_backoff_s: longest wait between retries.
        max_message_bytes: largest request or reply; bigger batches are chunked.
        transport: what carries the step calls (Lookup, Update): ``grpc``, ``ucx``
            (every shard must offer a UCX listener), or ``auto`` (UCX where every shard
            offers it and UCX loads here, else gRPC, said once).
    """

    timeout_s: float = 30.0
    max_attempts: int = 5
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    transport: str = "grpc"

    @classmethod
    def from_env(cls) -> ClientConfig:
        """Defaults overridden by EMBER_TIMEOUT_S, EMBER_MAX_ATTEMPTS, ..."""
        return dataclass_from_env(cls)

    def validate(self) -> None:
        """Raise ValueError naming the first field out of range."""
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.initial_backoff_s < 0 or self.max_backoff_s < self.initial_backoff_s:
            raise ValueError("need 0 <= initial_backoff_s <= max_backoff_s")
        if self.max_message_bytes < 1 << 16:
            raise ValueError(f"max_message_bytes must be >= 65536, got {self.max_message_bytes}")
        check_transport(self.transport)
