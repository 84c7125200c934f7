"""The Init stream's data messages reach the writer as views of the bytes gRPC received
(``modelinit.stub``): same payload, no parse, no copy; anything else is parsed as before."""
from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from modelinit.remote import RemoteSource
from modelinit.request import model_request
from modelinit.stub import data_or, data_payload
from modelinit_wire.events import Begin, Data, End
from modelinit_wire.v1 import modelinit_pb2 as pb

from .conftest import TINY

# Payload sizes at each varint length boundary, 0 to 3 bytes of length.
EDGES = [0, 1, 127, 128, 16383, 16384, (1 << 20) - 1, 1 << 20]


@pytest.mark.parametrize("size", EDGES)
def test_a_data_message_is_its_payload_viewed_in_place(size):
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    raw = pb.InitResponse(data=payload).SerializeToString()
    view = data_payload(raw)
    assert isinstance(view, memoryview) and view.obj is raw  # a view of the received bytes: no copy
    assert view.readonly and view == payload


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=3000))
def test_any_payload_round_trips(payload):
    raw = pb.InitResponse(data=payload).SerializeToString()
    assert bytes(data_or(pb.InitResponse)(raw)) == payload


@pytest.mark.parametrize("message", [
    pb.InitResponse(begin=pb.FileBegin(index=3, name="model.safetensors", size=10, offset=2)),
    pb.InitResponse(end=pb.FileEnd(index=3, sha256="ab" * 32)),
    pb.InitResponse(),
])
def test_other_messages_are_parsed(message):
    raw = message.SerializeToString()
    assert data_payload(raw) is None
    assert data_or(pb.InitResponse)(raw) == message


def test_a_data_field_with_anything_beside_it_is_parsed_not_viewed():
    data = pb.InitResponse(data=b"xyz").SerializeToString()
    begin = pb.InitResponse(begin=pb.FileBegin(index=1)).SerializeToString()
    unknown = bytes([0x78, 0x05])  # field 15, varint 5: unknown to InitResponse
    for raw in (data + unknown, unknown + data, begin + data, data + data):
        assert data_payload(raw) is None
        assert data_or(pb.InitResponse)(raw) == pb.InitResponse.FromString(raw)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_malformed_bytes_are_never_taken_for_data(raw):
    """A view is returned only for exactly tag, length, payload: whatever else protobuf decides."""
    view = data_payload(raw)
    if view is not None:
        assert pb.InitResponse.FromString(raw).data == bytes(view)
        assert pb.InitResponse(data=bytes(view)).SerializeToString() == raw


def test_truncated_and_overlong_lengths_are_not_data():
    assert data_payload(b"\x12") is None  # no length
    assert data_payload(b"\x12\x80") is None  # a varint cut short
    assert data_payload(b"\x12\x05abc") is None  # fewer bytes than announced
    assert data_payload(b"\x12\x01abc") is None  # more bytes than announced
    assert data_payload(b"\x12" + b"\xff" * 11 + b"\x01") is None  # a varint past 10 bytes


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
