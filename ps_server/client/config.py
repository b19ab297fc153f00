"""Typed configuration of a client of the shards."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ember.ps_server.client.transport import TRANSPORTS, check_transport
from ember.ps_server.security.credentials import TOKEN_ENV
from ember.ps_server.wire.keepalive import (
    DEFAULT_KEEPALIVE_S,
    MAX_KEEPALIVE_S,
    MIN_KEEPALIVE_S,
    check_keepalive,
)
from ember.ps_server.wire.messages import DEFAULT_MAX_MESSAGE_BYTES

from ember.settings import setting


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    """How a PSClient talks to shards: each field is a setting (flag, EMBER_* variable and
    cluster-file key; see :mod:`ember.settings`), described by its help text."""

    ENV_PREFIX: ClassVar[str] = "EMBER_CLIENT_"

    timeout_s: float = setting(30.0, "deadline of each call to a shard, seconds")
    max_attempts: int = setting(
        12,
        "tries per call while a shard is UNAVAILABLE and does not say it is restarting "
        "(1: no retry); the default backoff retries for about 13 s, long enough for a "
        "shard's process to be started again",
    )
    restart_patience_s: float = setting(
        600.0,
        "how long a call keeps retrying a shard that answers it is restarting (it exits for "
        "its supervisor, or is rebuilding its rows from its log), from its first such "
        "answer; those answers do not count against max_attempts, which bounds the other "
        "UNAVAILABLE ones",
    )
    initial_backoff_s: float = setting(0.05, "wait before the first retry; doubles each retry")
    max_backoff_s: float = setting(2.0, "longest wait between retries")
    max_message_bytes: int = setting(
        DEFAULT_MAX_MESSAGE_BYTES, "largest request or reply; bigger batches are split"
    )
    keepalive_s: float = setting(
        DEFAULT_KEEPALIVE_S,
        "gRPC: ping a shard this often while calls are in flight, and drop the connection "
        "(calls fail UNAVAILABLE) when a ping goes unanswered as long (at least 5 s); "
        f"{MIN_KEEPALIVE_S}..{MAX_KEEPALIVE_S:.0f}",
    )
    transport: str = setting(
        "grpc",
        "what carries the step calls (Lookup, Update): grpc, ucx (shards started with --ucx), "
        "or auto (ucx where every shard offers it and UCX loads here, else grpc, said once)",
        choices=TRANSPORTS,
    )
    tls_ca: str = setting(
        "", "PEM CA bundle that signed the shards' certificates: connect with TLS, verified"
    )
    tls_cert: str = setting(
        "", "PEM client certificate for shards that require mutual TLS (with --tls-key)"
    )
    tls_key: str = setting("", "PEM private key of --tls-cert")
    token_file: str = setting(
        "",
        "file holding the cluster's shared token, sent on every call; or put the token "
        f"itself in {TOKEN_ENV}",
    )

    def validate(self) -> None:
        """Raise ValueError naming the first field out of range."""
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if not self.restart_patience_s >= 0:
            raise ValueError(f"restart_patience_s must be >= 0, got {self.restart_patience_s}")
        if self.initial_backoff_s < 0 or self.max_backoff_s < self.initial_backoff_s:
            raise ValueError("need 0 <= initial_backoff_s <= max_backoff_s")
        if self.max_message_bytes < 1 << 16:
            raise ValueError(f"max_message_bytes must be >= 65536, got {self.max_message_bytes}")
        check_keepalive(self.keepalive_s)
        check_transport(self.transport)
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert and tls_key go together: give both or neither")
        if self.tls_cert and not self.tls_ca:
            raise ValueError("tls_cert (mutual TLS) needs tls_ca to verify the shards with")
