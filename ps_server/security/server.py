"""The shard's side: TLS server credentials and the interceptor that checks the token."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from ember.ps_server.security.credentials import METADATA_KEY, read_pem, token_matches

# Orchestrators probe health without credentials; one answer reveals nothing but serving or
# not (the Watch stream stays closed: it would hold resources for anyone).
OPEN_METHODS = ("/grpc.health.v1.Health/Check",)


def server_credentials(cert: str, key: str, client_ca: str) -> grpc.ServerCredentials:
    """TLS with the certificate ``cert`` and key ``key``; with ``client_ca``, mutual TLS that
    accepts only client certificates signed by it."""
    return grpc.ssl_server_credentials(
        [(read_pem(key, "TLS key"), read_pem(cert, "TLS certificate"))],
        root_certificates=read_pem(client_ca, "client CA") if client_ca else None,
        require_client_auth=bool(client_ca),
    )


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses every call without the shared token with UNAUTHENTICATED, before its handler
    runs or its request is parsed; health stays open.

    Args:
        token: the shared token.
    """

    def __init__(self, token: bytes) -> None:
        self._token = token

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        if details.method in OPEN_METHODS:
            return continuation(details)
        given = dict(details.invocation_metadata or ()).get(METADATA_KEY)
        if token_matches(self._token, given):
            return continuation(details)
        return _refusal(continuation(details), "no token" if given is None else "wrong token")


def _refusal(handler: grpc.RpcMethodHandler | None, reason: str) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s kind (unary for an unknown method, so that a caller without
    the token cannot tell which methods exist) that reads no request and answers
    UNAUTHENTICATED."""

    def refuse(request: Any, context: grpc.ServicerContext) -> None:
        context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            f"{reason}: calls need the cluster's token in the '{METADATA_KEY}' metadata",
        )

    if handler is None:
        return grpc.unary_unary_rpc_method_handler(refuse)
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)
