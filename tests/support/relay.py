"""A gRPC relay between the client and a real server that can change what passes: the tests of
the transit check put it on the path, as a faulty proxy, NIC or memory would be.

:func:`relay` (a fixture, registered in tests/conftest.py) starts one on a free loopback port in
front of ``target``: every call is forwarded as raw bytes, both ways, and each response message
of an Init stream (or of the ``stream`` named) passes through ``change(call, k, raw)`` first
(``call``: that stream's calls so far, from 0; ``k``: the message's index in its call), which
returns the bytes to send on.
"""
from __future__ import annotations

from concurrent import futures
from typing import Callable

import grpc
import pytest

from modelinit_wire import data_message

Change = Callable[[int, int, bytes], bytes]
_STREAMS = {"/modelinit.v1.ModelInit/Init", "/modelinit.v1.ModelInit/Tensors"}


def flip_bit(raw: bytes) -> bytes:
    """A data message with one bit of its payload flipped (its CRC32C left as it was)."""
    got = bytearray(raw)
    got[len(got) // 2] ^= 0x10
    return bytes(got)


def without_crc(raw: bytes) -> bytes:
    """A data message as a server older than the transit check sends it: the payload alone."""
    got = data_message.data_of(raw)
    return data_message.encode(got.payload) if isinstance(got, data_message.Checked) else raw


def is_data(raw: bytes) -> bool:
    return raw[:1] == bytes((data_message.DATA_TAG,))


def _passed_on(context) -> tuple:
    return tuple((k, v) for k, v in context.invocation_metadata() if k in ("x-request-id", "authorization"))


class _Relay(grpc.GenericRpcHandler):
    def __init__(self, channel: grpc.Channel, change: Change, stream: str) -> None:
        self.channel, self.change, self.stream = channel, change, stream
        self.init_calls = 0
        """Calls of the changed stream (Init unless another was named)."""

    def service(self, details):
        method = details.method
        if method in _STREAMS:
            forward = self.channel.unary_stream(method)
            changed = method.endswith(f"/{self.stream}")

            def stream(request: bytes, context):
                call = self.init_calls
                if changed:
                    self.init_calls += 1
                responses = forward(request, metadata=_passed_on(context))
                context.add_callback(responses.cancel)
                for k, raw in enumerate(responses):
                    yield self.change(call, k, raw) if changed else raw

            return grpc.unary_stream_rpc_method_handler(stream)
        forward_one = self.channel.unary_unary(method)
        return grpc.unary_unary_rpc_method_handler(
            lambda request, context: forward_one(request, metadata=_passed_on(context)))


@pytest.fixture()
def relay():
    """``start(target, change, stream="Init") -> (address, handler)``; the handler counts the
    changed stream's calls (``init_calls``)."""
    started = []

    def start(target: str, change: Change, stream: str = "Init") -> tuple[str, _Relay]:
        channel = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 16 << 20)])
        handler = _Relay(channel, change, stream)
        server = grpc.server(futures.ThreadPoolExecutor(4), handlers=(handler,),
                             options=[("grpc.max_receive_message_length", 16 << 20)])
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        started.append((server, channel))
        return f"127.0.0.1:{port}", handler

    yield start
    for server, channel in started:
        server.stop(None)
        channel.close()
