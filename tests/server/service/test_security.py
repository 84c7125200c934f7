"""TLS/mTLS credentials and bearer-token auth: real grpc.aio servers on loopback, the sync client."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from modelinit_server.service.security import (
    UNAUTHENTICATED_MESSAGE,
    TokenAuthInterceptor,
    check_tls_args,
    load_server_credentials,
    load_token,
)
from modelinit_wire.credentials import BearerToken, channel_credentials, make_channel

from tests.support.tls_certs import make_certs

TOKEN = "s3cret-token-0123456789"
STREAM_COUNT = 5
UNARY = "/test.Echo/Unary"
STREAM = "/test.Echo/Stream"
COLLECT = "/test.Echo/Collect"
CHAT = "/test.Echo/Chat"
#: Deadline of every call here: a hang guard only (the calls that fail do so at once), generous
#: for a loaded CI machine.
CALL_TIMEOUT = 60


async def _unary(request: bytes, context) -> bytes:
    return b"echo:" + request


async def _stream(request: bytes, context):
    for i in range(STREAM_COUNT):
        yield b"%d:" % i + request


async def _collect(requests, context) -> bytes:
    return b"+".join([r async for r in requests])


async def _chat(requests, context):
    async for r in requests:
        yield b"re:" + r


class BackgroundServer:
    """A grpc.aio server on 127.0.0.1:0 with health + a tiny echo service, on its own loop and thread."""

    def __init__(self, *, interceptors=(), credentials: grpc.ServerCredentials | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="test-security-server", daemon=True)
        self._thread.start()
        self._server, self.port = asyncio.run_coroutine_threadsafe(self._start(list(interceptors), credentials),
                                                                   self._loop).result(timeout=CALL_TIMEOUT)
        self.target = f"127.0.0.1:{self.port}"

    @staticmethod
    async def _start(interceptors, credentials):
        server = grpc.aio.server(interceptors=interceptors)
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("test.Echo", {
            "Unary": grpc.unary_unary_rpc_method_handler(_unary),
            "Stream": grpc.unary_stream_rpc_method_handler(_stream),
            "Collect": grpc.stream_unary_rpc_method_handler(_collect),
            "Chat": grpc.stream_stream_rpc_method_handler(_chat),
        })])
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        addr = "127.0.0.1:0"
        port = server.add_secure_port(addr, credentials) if credentials else server.add_insecure_port(addr)
        assert port
        await server.start()
        return server, port

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._server.stop(None), self._loop).result(timeout=CALL_TIMEOUT)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=CALL_TIMEOUT)
        self._loop.close()


def unary(channel, payload: bytes = b"hi", **kw) -> bytes:
    return channel.unary_unary(UNARY)(payload, timeout=CALL_TIMEOUT, **kw)


def stream(channel, payload: bytes = b"hi", **kw) -> list[bytes]:
    return list(channel.unary_stream(STREAM)(payload, timeout=CALL_TIMEOUT, **kw))


def check_health(channel) -> int:
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=CALL_TIMEOUT).status


# --- fixtures ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def rejected():
    return []


@pytest.fixture(scope="module")
def token_server(rejected):
    server = BackgroundServer(interceptors=[TokenAuthInterceptor(TOKEN, on_reject=rejected.append)])
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tls_server(certs):
    server = BackgroundServer(credentials=load_server_credentials(certs.server_cert, certs.server_key))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mtls_server(certs):
    server = BackgroundServer(credentials=load_server_credentials(certs.server_cert, certs.server_key, certs.ca))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tls_token_server(certs):
    server = BackgroundServer(interceptors=[TokenAuthInterceptor(TOKEN)],
                              credentials=load_server_credentials(certs.server_cert, certs.server_key))
    yield server
    server.stop()


def assert_unauthenticated(call) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert info.value.details() == UNAUTHENTICATED_MESSAGE


# --- bearer token ------------------------------------------------------------------------------------

def test_no_token_is_unauthenticated_on_unary_and_stream(token_server):
    with make_channel(token_server.target) as channel:
        assert_unauthenticated(lambda: unary(channel))
        assert_unauthenticated(lambda: stream(channel))


@pytest.mark.parametrize("token", [TOKEN[:-1] + "X", "short", TOKEN + "-and-longer"], ids=["same-length", "shorter", "longer"])
def test_wrong_token_is_unauthenticated(token_server, token):
    assert len(TOKEN[:-1] + "X") == len(TOKEN)
    with make_channel(token_server.target, token=token) as channel:
        assert_unauthenticated(lambda: unary(channel))
        assert_unauthenticated(lambda: stream(channel))


def test_wrong_scheme_is_unauthenticated(token_server):
    with make_channel(token_server.target) as channel:
        assert_unauthenticated(lambda: unary(channel, metadata=[("authorization", f"Basic {TOKEN}")]))
        assert_unauthenticated(lambda: unary(channel, metadata=[("authorization", TOKEN)]))


def test_right_token_passes_and_stream_delivers_everything(token_server):
    with make_channel(token_server.target, token=TOKEN) as channel:
        assert unary(channel, b"x") == b"echo:x"
        assert stream(channel, b"y") == [b"%d:y" % i for i in range(STREAM_COUNT)]
        # Other metadata survives the interceptor.
        response, call = channel.unary_unary(UNARY).with_call(b"z", timeout=CALL_TIMEOUT, metadata=[("x-request-id", "abc")])
        assert response == b"echo:z"


def test_token_interceptor_keeps_existing_metadata():
    seen = {}

    def continuation(details, request):
        seen["details"], seen["request"] = details, request
        return "result"

    class Details(grpc.ClientCallDetails):  # no _replace, like some implementations
        method, timeout, metadata, credentials, wait_for_ready, compression = UNARY, 3.0, (("x-request-id", "abc"),), None, True, None

    assert BearerToken(TOKEN).intercept_unary_unary(continuation, Details(), b"req") == "result"
    details = seen["details"]
    assert isinstance(details, grpc.ClientCallDetails)
    assert (details.method, details.timeout, details.wait_for_ready) == (UNARY, 3.0, True)
    assert list(details.metadata) == [("x-request-id", "abc"), ("authorization", f"Bearer {TOKEN}")]
    assert seen["request"] == b"req"
    assert TOKEN not in repr(BearerToken(TOKEN))


def test_client_streaming_methods_are_guarded_too(token_server):
    with make_channel(token_server.target) as channel:
        assert_unauthenticated(lambda: channel.stream_unary(COLLECT)(iter([b"a", b"b"]), timeout=CALL_TIMEOUT))
        assert_unauthenticated(lambda: list(channel.stream_stream(CHAT)(iter([b"a", b"b"]), timeout=CALL_TIMEOUT)))
    with make_channel(token_server.target, token=TOKEN) as channel:
        assert channel.stream_unary(COLLECT)(iter([b"a", b"b"]), timeout=CALL_TIMEOUT) == b"a+b"
        assert list(channel.stream_stream(CHAT)(iter([b"a", b"b"]), timeout=CALL_TIMEOUT)) == [b"re:a", b"re:b"]


def test_health_needs_no_token(token_server):
    with make_channel(token_server.target) as channel:
        assert check_health(channel) == health_pb2.HealthCheckResponse.SERVING


def test_on_reject_gets_the_method(token_server, rejected):
    rejected.clear()
    with make_channel(token_server.target) as channel:
        with pytest.raises(grpc.RpcError):
            stream(channel)
        check_health(channel)  # exempt: not rejected
    assert rejected == [STREAM]


def test_unknown_method_without_token_is_unauthenticated(token_server):
    with make_channel(token_server.target) as channel:
        assert_unauthenticated(lambda: channel.unary_unary("/test.Echo/Nope")(b"", timeout=CALL_TIMEOUT))


# --- TLS / mTLS --------------------------------------------------------------------------------------

def test_tls_round_trip(tls_server, certs):
    with make_channel(tls_server.target, ca=certs.ca) as channel:
        assert unary(channel, b"t") == b"echo:t"
        assert stream(channel, b"t") == [b"%d:t" % i for i in range(STREAM_COUNT)]
        assert check_health(channel) == health_pb2.HealthCheckResponse.SERVING


def test_tls_with_untrusted_ca_fails(tls_server, certs):
    with make_channel(tls_server.target, ca=certs.other_ca) as channel:
        with pytest.raises(grpc.RpcError) as info:
            unary(channel)
        assert info.value.code() != grpc.StatusCode.OK


def test_plaintext_client_against_tls_server_fails(tls_server):
    with make_channel(tls_server.target) as channel:
        with pytest.raises(grpc.RpcError):
            unary(channel)


def test_mtls_with_client_cert_from_the_right_ca(mtls_server, certs):
    with make_channel(mtls_server.target, ca=certs.ca, cert=certs.client_cert, key=certs.client_key) as channel:
        grpc.channel_ready_future(channel).result(timeout=CALL_TIMEOUT)
        assert unary(channel, b"m") == b"echo:m"
        assert stream(channel, b"m") == [b"%d:m" % i for i in range(STREAM_COUNT)]


def test_mtls_without_client_cert_fails(mtls_server, certs):
    with make_channel(mtls_server.target, ca=certs.ca) as channel:
        with pytest.raises(grpc.RpcError) as info:
            unary(channel)
        assert info.value.code() != grpc.StatusCode.OK


def test_mtls_with_client_cert_from_another_ca_fails(mtls_server, certs):
    with make_channel(mtls_server.target, ca=certs.ca, cert=certs.other_client_cert, key=certs.other_client_key) as channel:
        with pytest.raises(grpc.RpcError) as info:
            unary(channel)
        assert info.value.code() != grpc.StatusCode.OK


def test_tls_and_token_together(tls_token_server, certs):
    with make_channel(tls_token_server.target, ca=certs.ca) as channel:
        assert_unauthenticated(lambda: unary(channel))
        assert check_health(channel) == health_pb2.HealthCheckResponse.SERVING
    with make_channel(tls_token_server.target, ca=certs.ca, token=TOKEN) as channel:
        assert unary(channel, b"b") == b"echo:b"
        assert stream(channel, b"b") == [b"%d:b" % i for i in range(STREAM_COUNT)]


# --- error messages ----------------------------------------------------------------------------------

def test_check_tls_args():
    check_tls_args(None, None, None)
    check_tls_args("c.pem", "k.pem", None)
    check_tls_args("c.pem", "k.pem", "ca.pem")
    with pytest.raises(ValueError, match=r"^tls_key: --tls-cert needs --tls-key"):
        check_tls_args("c.pem", None, None)
    with pytest.raises(ValueError, match=r"^tls_cert: --tls-key needs --tls-cert"):
        check_tls_args(None, "k.pem", None)
    with pytest.raises(ValueError, match=r"^tls_client_ca: .*needs --tls-cert and --tls-key"):
        check_tls_args(None, None, "ca.pem")


def test_load_server_credentials_errors(certs, tmp_path):
    missing = str(tmp_path / "missing.pem")
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello\n")
    with pytest.raises(ValueError, match=r"^tls_cert: cannot read '.*missing\.pem' \(No such file or directory\); pass a PEM certificate"):
        load_server_credentials(missing, certs.server_key)
    with pytest.raises(ValueError, match=r"^tls_key: cannot read '.*missing\.pem'"):
        load_server_credentials(certs.server_cert, missing)
    with pytest.raises(ValueError, match=r"^tls_client_ca: cannot read '.*missing\.pem'"):
        load_server_credentials(certs.server_cert, certs.server_key, missing)
    with pytest.raises(ValueError, match=r"^tls_cert: '.*not\.pem' is not a PEM file"):
        load_server_credentials(str(not_pem), certs.server_key)
    with pytest.raises(ValueError, match=r"^tls_key: '.*server\.pem' is not a PEM file"):
        load_server_credentials(certs.server_cert, certs.server_cert)  # a certificate is not a key
    with pytest.raises(ValueError, match=r"^tls_key: --tls-cert needs --tls-key"):
        load_server_credentials(certs.server_cert, None)
    assert isinstance(load_server_credentials(certs.server_cert, certs.server_key, certs.ca), grpc.ServerCredentials)


def test_load_token(tmp_path):
    assert load_token(None) is None
    assert load_token("abc") == "abc"
    secret = tmp_path / "token"
    secret.write_text("  from-a-file\n")
    assert load_token(f"@{secret}") == "from-a-file"
    with pytest.raises(ValueError, match=r"^token: empty"):
        load_token("")
    with pytest.raises(ValueError, match=r"^token: empty"):
        load_token("   ")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ValueError, match=r"^token: token file '.*empty' is empty"):
        load_token(f"@{empty}")
    with pytest.raises(ValueError, match=r"^token: cannot read token file '.*nope' \(No such file or directory\)"):
        load_token(f"@{tmp_path / 'nope'}")
    with pytest.raises(ValueError, match=r"^token: must be printable ASCII"):
        load_token("two words")
    with pytest.raises(ValueError, match=r"^token:"):
        TokenAuthInterceptor("")


def test_channel_credentials_errors(certs, tmp_path):
    missing = str(tmp_path / "missing.pem")
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello\n")
    with pytest.raises(ValueError, match=r"^key: "):
        channel_credentials(ca=certs.ca, cert=certs.client_cert)
    with pytest.raises(ValueError, match=r"^cert: "):
        channel_credentials(ca=certs.ca, key=certs.client_key)
    with pytest.raises(ValueError, match=r"^ca: cannot read '.*missing\.pem' \(No such file or directory\)"):
        channel_credentials(ca=missing)
    with pytest.raises(ValueError, match=r"^cert: cannot read '.*missing\.pem'"):
        channel_credentials(cert=missing, key=certs.client_key)
    with pytest.raises(ValueError, match=r"^key: '.*not\.pem' is not a PEM file"):
        channel_credentials(cert=certs.client_cert, key=str(not_pem))
    with pytest.raises(ValueError, match=r"^ca: cannot read"):
        make_channel("127.0.0.1:1", ca=missing)
    with pytest.raises(ValueError, match=r"^token:"):
        make_channel("127.0.0.1:1", token="")
    assert isinstance(channel_credentials(), grpc.ChannelCredentials)
    assert isinstance(channel_credentials(certs.ca, certs.client_cert, certs.client_key), grpc.ChannelCredentials)


def test_client_credentials_module_stays_thin():
    code = ("import sys, modelinit_wire.credentials; "
            "heavy = {'cryptography', 'numpy', 'torch', 'modelinit_server'} & set(sys.modules); "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
