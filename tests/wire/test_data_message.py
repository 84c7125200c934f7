"""A data message's wire shape (``modelinit_wire.data_message``): the server encodes it in
protobuf's own bytes, the client's stub (``modelinit.sources.stub``) hands its payload to the writer as a
view of the bytes gRPC received, no parse, no copy; anything else is parsed as before."""
from __future__ import annotations

import asyncio
import hashlib
from concurrent.futures import ThreadPoolExecutor

import modelinit
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from modelinit.sources.remote import RemoteSource
from modelinit.request import model_request
from modelinit.sources.stub import data_or
from modelinit_server.engine.backends import select
from modelinit_server.service import data_messages
from modelinit_server.service.servicer import ModelInitServicer
from modelinit_wire.data_message import encode, payload_of
from modelinit_wire.events import Begin, Data, End
from modelinit_wire.v1 import modelinit_pb2 as pb
from modelinit_wire.v1 import modelinit_pb2_grpc as pb_grpc

from tests.support import TINY

# Payload sizes at each varint length boundary, 0 to 3 bytes of length.
EDGES = [0, 1, 127, 128, 16383, 16384, (1 << 20) - 1, 1 << 20]


@pytest.mark.parametrize("size", EDGES)
def test_a_data_message_is_its_payload_viewed_in_place(size):
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    raw = pb.InitResponse(data=payload).SerializeToString()
    view = payload_of(raw)
    assert isinstance(view, memoryview) and view.obj is raw  # a view of the received bytes: no copy
    assert view.readonly and view == payload


@pytest.mark.parametrize("size", EDGES)
def test_the_encoding_is_protobufs_own(size):
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    wire = encode(memoryview(payload))
    assert wire == pb.InitResponse(data=payload).SerializeToString()
    assert wire == pb.TensorsResponse(data=payload).SerializeToString()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=3000), st.integers(0, 64), st.integers(0, 64))
def test_any_payload_round_trips(payload, before, after):
    """Encoded from a view inside a larger buffer, decoded by protobuf and by the stub alike."""
    buffer = bytes(before) + payload + bytes(after)
    raw = encode(memoryview(buffer)[before : before + len(payload)])
    assert pb.InitResponse.FromString(raw).data == payload
    assert bytes(data_or(pb.InitResponse)(raw)) == payload


@pytest.mark.parametrize("message", [
    pb.InitResponse(begin=pb.FileBegin(index=3, name="model.safetensors", size=10, offset=2)),
    pb.InitResponse(end=pb.FileEnd(index=3, sha256="ab" * 32)),
    pb.InitResponse(),
])
def test_other_messages_are_parsed(message):
    raw = message.SerializeToString()
    assert payload_of(raw) is None
    assert data_or(pb.InitResponse)(raw) == message


def test_a_data_field_with_anything_beside_it_is_parsed_not_viewed():
    data = pb.InitResponse(data=b"xyz").SerializeToString()
    begin = pb.InitResponse(begin=pb.FileBegin(index=1)).SerializeToString()
    unknown = bytes([0x78, 0x05])  # field 15, varint 5: unknown to InitResponse
    for raw in (data + unknown, unknown + data, begin + data, data + data):
        assert payload_of(raw) is None
        assert data_or(pb.InitResponse)(raw) == pb.InitResponse.FromString(raw)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_malformed_bytes_are_never_taken_for_data(raw):
    """A view is returned only for exactly tag, length, payload: whatever else protobuf decides."""
    view = payload_of(raw)
    if view is not None:
        assert pb.InitResponse.FromString(raw).data == bytes(view)
        assert pb.InitResponse(data=bytes(view)).SerializeToString() == raw


def test_truncated_and_overlong_lengths_are_not_data():
    assert payload_of(b"\x12") is None  # no length
    assert payload_of(b"\x12\x80") is None  # a varint cut short
    assert payload_of(b"\x12\x05abc") is None  # fewer bytes than announced
    assert payload_of(b"\x12\x01abc") is None  # more bytes than announced
    assert payload_of(b"\x12" + b"\xff" * 11 + b"\x01") is None  # a varint past 10 bytes


def test_the_remote_stream_hands_the_writer_views_of_grpcs_bytes(server_target):
    """The structural fact behind the speed-up: each Data event of a served stream is a view of
    an immutable ``bytes`` (what gRPC gave), and the files' bytes hash to the server's digests."""
    source = RemoteSource(server_target)
    request = model_request(TINY["llama"], seed=5, dtype="bfloat16", max_shard_size="200KB")
    plan = source.plan(request)
    digests, views, current = {}, 0, None
    try:
        for event in source.events(request, plan):
            if isinstance(event, Data):
                assert isinstance(event.data, memoryview) and isinstance(event.data.obj, bytes)
                current.update(event.data)
                views += 1
            elif isinstance(event, Begin):
                current = hashlib.sha256()
            else:
                assert isinstance(event, End)
                digests[event.index] = (current.hexdigest(), event.sha256)
    finally:
        source.close()
    assert views > 0 and len(digests) == len(plan.files)
    assert all(mine == theirs for mine, theirs in digests.values())


# --- the server: ready bytes, passed through ----------------------------------------------------

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


def test_remote_tensors_arrive_as_payload_views_and_equal_the_embedded(server_target):
    """The Tensors stream too: its data messages reach ``Client.tensors`` as views of gRPC's bytes,
    and the tensors equal the embedded client's."""
    req = model_request(TINY["llama"], seed=3, dtype="bfloat16")
    source = RemoteSource(server_target)
    try:
        stream = list(source.tensors(pb.TensorsRequest(request=req, chunk_size=4096)))
    finally:
        source.close()
    views = [m for m in stream if isinstance(m, memoryview)]
    assert views and all(isinstance(v.obj, bytes) for v in views)
    assert all(m.WhichOneof("event") == "begin" for m in stream if not isinstance(m, memoryview))
    with modelinit.Client(server_target) as remote, modelinit.Client() as local:
        got, want = remote.tensors(TINY["llama"], seed=3, dtype="bfloat16", as_="bytes"), \
            local.tensors(TINY["llama"], seed=3, dtype="bfloat16", as_="bytes")
    assert got.keys() == want.keys() and len(got) > 0
    assert all(bytes(got[k].data) == bytes(want[k].data) and got[k].shape == want[k].shape for k in want)


def test_the_client_asks_for_the_largest_chunks(server_target):
    """modelinit's client asks for MAX_CHUNK-byte messages (0 would mean DEFAULT_CHUNK): fewer
    messages for the same bytes; a caller's own Tensors request is left as it was."""
    from modelinit_wire.constants import DEFAULT_CHUNK, MAX_CHUNK

    source = RemoteSource(server_target)
    req = model_request("gpt2", seed=0)
    try:
        plan = source.plan(req)
        sizes = []
        events = source.events(req, plan)
        for event in events:
            if isinstance(event, Data):
                sizes.append(len(event.data))
                if len(sizes) == 8:
                    break
        events.close()
        asked = pb.TensorsRequest(request=req, selections=[pb.TensorSelection(name="transformer.wte.weight")])
        views = [m for m in source.tensors(asked) if isinstance(m, memoryview)]
    finally:
        source.close()
    assert max(sizes) == MAX_CHUNK > DEFAULT_CHUNK
    assert max(len(v) for v in views) == MAX_CHUNK and asked.chunk_size == 0
