"""Client side of transport security: TLS/mTLS channel credentials and a bearer token.

    channel = make_channel("models.example:443", tls=True, token=os.environ["MODELINIT_TOKEN"])
    channel = make_channel("10.0.0.5:50051", ca="ca.pem", cert="client.pem", key="client.key")  # mTLS

Stdlib and grpc only, like the rest of the client. Errors are ``ValueError`` whose message
starts with the offending argument (``ca: cannot read '/x.pem' (No such file or directory)``).
"""
from __future__ import annotations

import collections
from typing import Any, Sequence

import grpc

__all__ = ["BearerToken", "channel_credentials", "make_channel"]

_WHAT = {
    "ca": ("CERTIFICATE", "pass the PEM certificate(s) of the CA that signed the server certificate"),
    "cert": ("CERTIFICATE", "pass the PEM client certificate chain"),
    "key": ("PRIVATE KEY", "pass the PEM private key of the client certificate"),
}


def _read_pem(arg: str, path: str | None) -> bytes | None:
    if path is None:
        return None
    marker, fix = _WHAT[arg]
    return read_pem(arg, path, marker, fix)


def read_pem(arg: str, path: str, marker: str, fix: str) -> bytes:
    """The PEM file at ``path``; ValueError naming ``arg`` and saying ``fix`` when it cannot be
    read or holds no ``marker`` block (``CERTIFICATE``, ``PRIVATE KEY``). The server's TLS
    loader uses it too."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"{arg}: cannot read {str(path)!r} ({e.strerror or e}); {fix}") from None
    if b"-----BEGIN" not in data or marker.encode() not in data:
        raise ValueError(f"{arg}: {str(path)!r} is not a PEM file (no '-----BEGIN ...{marker}-----' block); {fix}")
    return data


def channel_credentials(ca: str | None = None, cert: str | None = None, key: str | None = None) -> grpc.ChannelCredentials:
    """TLS credentials: the system roots, or ``ca`` (a PEM file) as the only trusted root; with
    ``cert`` and ``key`` (PEM files) the client also presents a certificate (mutual TLS)."""
    if cert is not None and key is None:
        raise ValueError("key: a client certificate (cert) needs its private key (key)")
    if key is not None and cert is None:
        raise ValueError("cert: a client private key (key) needs its certificate (cert)")
    return grpc.ssl_channel_credentials(
        root_certificates=_read_pem("ca", ca),
        private_key=_read_pem("key", key),
        certificate_chain=_read_pem("cert", cert),
    )


class _CallDetails(
    collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")),
    grpc.ClientCallDetails,
):
    pass


def load_token(value: str | None) -> str | None:
    """The bearer token from a setting: the value itself, or with ``@path`` the content of that
    file, whitespace stripped (e.g. a Kubernetes secret mount). None/unset means no token."""
    if value is None:
        return None
    token = value
    if value.startswith("@"):
        path = value[1:]
        try:
            with open(path, encoding="utf-8") as f:
                token = f.read()
        except (OSError, UnicodeDecodeError, ValueError) as e:  # ValueError: a NUL in the path
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise ValueError(f"token: cannot read token file {path!r} ({reason}); pass @<path to a file holding the token>") from None
        if not token.strip():
            raise ValueError(f"token: token file {path!r} is empty; put the token in it")
    token = token.strip()
    _check_token(token)
    return token


def _check_token(token: str) -> None:
    if not token:
        raise ValueError("token: empty token; pass a non-empty token or @<file>, or leave it unset to disable auth")
    if not token.isascii() or not token.isprintable() or any(c.isspace() for c in token):
        raise ValueError("token: must be printable ASCII without whitespace (it travels in the 'authorization' header)")


class BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                  grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds ``authorization: Bearer <token>`` to the metadata of every call.

    Unlike call credentials this also works on insecure channels (loopback deployments, tests);
    over a network, use it with TLS so the token is not sent in the clear.
    """

    def __init__(self, token: str) -> None:
        _check_token(token)
        self._header = ("authorization", f"Bearer {token}")

    def __repr__(self) -> str:  # never show the token
        return "BearerToken(<hidden>)"

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = [(k, v) for k, v in (details.metadata or ()) if k.lower() != "authorization"]
        metadata.append(self._header)
        return _CallDetails(
            details.method,
            details.timeout,
            metadata,
            getattr(details, "credentials", None),
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)


def make_channel(target: str, *, tls: bool = False, ca: str | None = None, cert: str | None = None,
                 key: str | None = None, token: str | None = None,
                 options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
    """A channel to ``target``: TLS when ``tls`` or any of ``ca``/``cert``/``key`` is given (see
    :func:`channel_credentials`), else plaintext; every call carries ``token`` when given.
    ``close()`` (or ``with``) closes the underlying channel."""
    options = list(options)
    interceptor = BearerToken(token) if token is not None else None  # validate before connecting
    if tls or ca is not None or cert is not None or key is not None:
        channel = grpc.secure_channel(target, channel_credentials(ca, cert, key), options=options)
    else:
        channel = grpc.insecure_channel(target, options=options)
    if interceptor is not None:
        channel = grpc.intercept_channel(channel, interceptor)
    return channel
