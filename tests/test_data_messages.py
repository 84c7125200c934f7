"""The server's data messages are encoded once, in the bytes protobuf itself makes
(``modelinit_server.service.data_messages``), and sent as they are."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from modelinit_server.engine.backends import select
from modelinit_server.service import data_messages
from modelinit_server.service.servicer import ModelInitServicer
from modelinit_wire.v1 import modelinit_pb2 as pb
from modelinit_wire.v1 import modelinit_pb2_grpc as pb_grpc

EDGES = [0, 1, 127, 128, 16383, 16384, 2097151, 2097152]


@pytest.mark.parametrize("size", EDGES)
def test_the_encoding_is_protobufs_own(size):
    payload = np.arange(size, dtype=np.uint8).tobytes()
    wire = data_messages.encode_data(memoryview(payload))
    assert wire == pb.InitResponse(data=payload).SerializeToString()
    assert wire == pb.TensorsResponse(data=payload).SerializeToString()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=5000), st.integers(0, 64), st.integers(0, 64))
def test_a_view_inside_a_larger_buffer_encodes_just_itself(payload, before, after):
    buffer = bytes(before) + payload + bytes(after)
    view = memoryview(buffer)[before : before + len(payload)]
    assert pb.InitResponse.FromString(data_messages.encode_data(view)).data == payload


class _Server:
    def __init__(self) -> None:
        self.generic, self.registered = [], {}

    def add_generic_rpc_handlers(self, handlers) -> None:
        self.generic.extend(handlers)

    def add_registered_method_handlers(self, name, handlers) -> None:
        self.registered[name] = handlers


def test_every_rpc_is_registered_and_only_the_streams_pass_bytes_through():
    ours, generated = _Server(), _Server()
    servicer = pb_grpc.ModelInitServicer()
    data_messages.add_servicer(servicer, ours)
    pb_grpc.add_ModelInitServicer_to_server(servicer, generated)
    (name, handlers), = ours.registered.items()
    (gen_name, gen_handlers), = generated.registered.items()
    assert name == gen_name and handlers.keys() == gen_handlers.keys() and len(ours.generic) == 1
    begin = pb.InitResponse(begin=pb.FileBegin(index=1, name="a", size=3))
    for rpc, handler in handlers.items():
        assert handler.request_deserializer == gen_handlers[rpc].request_deserializer
        if rpc in data_messages.ENCODED_STREAMS:
            assert handler.response_serializer(b"\x12\x01x") == b"\x12\x01x"  # sent as it is
            assert handler.response_serializer(begin) == begin.SerializeToString()
        else:
            assert handler.response_serializer is gen_handlers[rpc].response_serializer


def test_the_servicer_writes_each_chunk_encoded_once():
    """What ``_send`` hands gRPC: ready wire bytes (not message objects that gRPC serializes after
    two more copies), each a data message of at most ``chunk`` bytes, together the segment."""
    servicer = ModelInitServicer(select("reference"), ThreadPoolExecutor(1))
    segment = np.random.default_rng(0).integers(0, 256, 10_000, dtype=np.uint8)
    written = []

    async def write(message) -> None:
        written.append(message)

    sent = asyncio.run(servicer._send(write, segment, 4096))
    assert sent == segment.nbytes and all(type(m) is bytes for m in written)
    pieces = [pb.InitResponse.FromString(m).data for m in written]
    assert [len(p) for p in pieces] == [4096, 4096, 1808]
    assert b"".join(pieces) == segment.tobytes()
