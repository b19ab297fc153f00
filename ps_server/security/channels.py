"""The client's side: a channel to a shard with TLS where asked and the token on every call."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import grpc
from ember.ps_server.security.credentials import METADATA_KEY, authorization_value, read_pem

log = logging.getLogger(__name__)


class _TokenMetadata(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds ``authorization: Bearer <token>`` to every call."""

    def __init__(self, token: bytes) -> None:
        self._entry = (METADATA_KEY, authorization_value(token))

    def _with_token(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return details._replace(metadata=[*(details.metadata or ()), self._entry])

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)


def open_channel(
    endpoint: str,
    options: Sequence[tuple[str, Any]] = (),
    tls_ca: str = "",
    tls_cert: str = "",
    tls_key: str = "",
    token: bytes | None = None,
) -> grpc.Channel:
    """A channel to ``endpoint``: TLS verified by ``tls_ca`` where given (mutual TLS with
    ``tls_cert`` and ``tls_key``), plaintext otherwise; ``token`` on every call where given."""
    if token and not tls_ca:
        log.warning(
            "sending the token to %s without TLS: anyone on the path can read it (use --tls-ca)",
            endpoint,
        )
    if tls_ca:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=read_pem(tls_ca, "CA bundle"),
            private_key=read_pem(tls_key, "TLS key") if tls_key else None,
            certificate_chain=read_pem(tls_cert, "TLS certificate") if tls_cert else None,
        )
        channel = grpc.secure_channel(endpoint, credentials, options=list(options))
    else:
        channel = grpc.insecure_channel(endpoint, options=list(options))
    return grpc.intercept_channel(channel, _TokenMetadata(token)) if token else channel
