"""Transport security and authentication for the server: TLS/mTLS credentials and a bearer token.

Wiring (see :func:`modelinit_server.service.server.start`)::

    check_tls_args(cert, key, client_ca)
    interceptors = [TokenAuthInterceptor(load_token(token))] if token else []
    server = grpc.aio.server(interceptors=interceptors)
    if cert:
        server.add_secure_port(addr, load_server_credentials(cert, key, client_ca))
    else:
        server.add_insecure_port(addr)

Errors are ``ValueError`` whose message starts with the offending setting and says how to fix
it (``tls_cert: cannot read '/x.pem' (No such file or directory); pass a PEM certificate chain``).
The token is never logged nor put into an error message.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
from typing import Callable, Iterable, Sequence

import grpc
from modelinit_wire.credentials import load_token, read_pem  # noqa: F401 - load_token: the server's too

log = logging.getLogger("modelinit.security")

#: The status message of a rejected call: says what the server expects and how the client sends it.
UNAUTHENTICATED_MESSAGE = (
    'missing or invalid bearer token (metadata "authorization: Bearer <token>"; modelinit --token or MODELINIT_TOKEN)'
)

#: Methods that need no token: health checks come from load balancers and kubelets.
DEFAULT_EXEMPT_PREFIXES: tuple[str, ...] = ("/grpc.health.v1.Health/",)

_WHAT = {
    "tls_cert": ("CERTIFICATE", "pass a PEM certificate chain (server certificate first)"),
    "tls_key": ("PRIVATE KEY", "pass the PEM private key of --tls-cert"),
    "tls_client_ca": ("CERTIFICATE", "pass the PEM certificate(s) of the CA that signs client certificates"),
}


def check_tls_args(cert: str | None, key: str | None, client_ca: str | None = None) -> None:
    """ValueError unless the TLS settings are consistent: cert and key together; client_ca only with both."""
    if cert and not key:
        raise ValueError("tls_key: --tls-cert needs --tls-key (the PEM private key of the certificate)")
    if key and not cert:
        raise ValueError("tls_cert: --tls-key needs --tls-cert (the PEM certificate chain of the key)")
    if client_ca and not cert:
        raise ValueError("tls_client_ca: --tls-client-ca (mTLS) needs --tls-cert and --tls-key: "
                         "client certificates are only checked on a TLS port")


def _read_pem(flag: str, path: str) -> bytes:
    marker, fix = _WHAT[flag]
    return read_pem(flag, path, marker, fix)


def load_server_credentials(cert: str, key: str, client_ca: str | None = None) -> grpc.ServerCredentials:
    """Server credentials from PEM files: TLS, or mutual TLS (client certificate required) when
    ``client_ca`` is given. ValueError naming the setting when a file is missing or not PEM."""
    check_tls_args(cert, key, client_ca)
    chain = _read_pem("tls_cert", cert)
    private_key = _read_pem("tls_key", key)
    roots = _read_pem("tls_client_ca", client_ca) if client_ca else None
    return grpc.ssl_server_credentials(
        [(private_key, chain)],
        root_certificates=roots,
        require_client_auth=roots is not None,
    )


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


def _unauthenticated_handler(real: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``real`` (stream-stream for an unknown method: it reads nothing,
    so it answers any kind of call) that aborts with UNAUTHENTICATED."""

    async def reject(_request, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)

    async def reject_stream(_request, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
        yield  # pragma: no cover - abort raises; this makes the function an async generator

    if real is None:
        return grpc.stream_stream_rpc_method_handler(reject_stream)
    kwargs = dict(request_deserializer=real.request_deserializer, response_serializer=real.response_serializer)
    if real.request_streaming and real.response_streaming:
        return grpc.stream_stream_rpc_method_handler(reject_stream, **kwargs)
    if real.request_streaming:
        return grpc.stream_unary_rpc_method_handler(reject, **kwargs)
    if real.response_streaming:
        return grpc.unary_stream_rpc_method_handler(reject_stream, **kwargs)
    return grpc.unary_unary_rpc_method_handler(reject, **kwargs)


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Requires ``authorization: Bearer <token>`` metadata on every call except the exempt methods
    (health checks by default). Rejected calls end with UNAUTHENTICATED before the handler runs.

    The comparison is constant-time (``hmac.compare_digest`` of SHA-256 digests, so neither the
    content nor the length of the token leaks through timing). ``on_reject(method)`` is called for
    each rejected call (metrics, logging); the token itself is never logged.
    """

    def __init__(self, token: str, exempt_prefixes: Sequence[str] | Iterable[str] = DEFAULT_EXEMPT_PREFIXES,
                 on_reject: Callable[[str], None] | None = None) -> None:
        if not token:
            raise ValueError("token: empty token; pass a non-empty token or leave it unset to disable auth")
        self._expected = _digest(token.encode("utf-8"))
        self._exempt = (exempt_prefixes,) if isinstance(exempt_prefixes, str) else tuple(exempt_prefixes)
        self._on_reject = on_reject

    def _authorized(self, metadata) -> bool:
        ok = False
        for key, value in metadata or ():
            if key.lower() != "authorization":
                continue
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            scheme, _, credential = value.strip().partition(" ")
            if scheme.lower() != "bearer":
                continue
            # Every header is compared (no early exit), each in constant time.
            ok |= hmac.compare_digest(_digest(credential.strip().encode("utf-8")), self._expected)
        return ok

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method or ""
        if method.startswith(self._exempt) or self._authorized(handler_call_details.invocation_metadata):
            return await continuation(handler_call_details)
        log.debug("rejected %s: missing or invalid bearer token", method)
        if self._on_reject is not None:
            try:
                self._on_reject(method)
            except Exception:  # a broken metrics hook must not turn a rejection into an acceptance
                log.exception("on_reject hook failed")
        return _unauthenticated_handler(await continuation(handler_call_details))
