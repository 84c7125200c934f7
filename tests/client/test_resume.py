"""A resumed Init stream (modelinit.sources.remote.ResumingEvents) against scripted replicas: where it asks
again after a lost server and after a corrupted message, what it refuses, what close() ends.
The served path is covered end to end in test_transit_check.py; these pin the decisions."""
from __future__ import annotations

import logging

import crc32c
import grpc
import pytest
from modelinit.errors import ModelInitError
from modelinit.sources.remote import Replicas, ResumingEvents, RetryPolicy
from modelinit_wire.data_message import Checked
from modelinit_wire.events import Begin, Data, End
from modelinit_wire.v1 import modelinit_pb2 as pb

FILE = bytes(range(12))
PLAN = pb.PlanResponse(fingerprint="fp", files=[pb.FilePlan(name="f0", size=len(FILE))])
FAST = RetryPolicy(deadline=30, initial_backoff=0.001, max_backoff=0.001)


class Lost(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "lost on purpose"


class Call:
    def __init__(self, messages):
        self._messages, self.cancelled = iter(messages), False

    def __iter__(self):
        return self

    def __next__(self):
        msg = next(self._messages)
        if isinstance(msg, Exception):
            raise msg
        return msg

    def cancel(self):
        self.cancelled = True


class Replica:
    """Answers each Init with the next of ``streams``: a list of messages (an exception in it is raised there)."""

    def __init__(self, *streams):
        self.streams, self.asked, self.calls = list(streams), [], []

    def Plan(self, request, timeout=None, metadata=None):
        return pb.PlanResponse(fingerprint="fp")

    def Init(self, init, timeout=None, metadata=None):
        self.asked.append((init.offset, list(init.files)))
        self.calls.append(Call(self.streams.pop(0)))
        return self.calls[-1]


def begin(offset=0):
    return pb.InitResponse(begin=pb.FileBegin(index=0, name="f0", size=len(FILE), offset=offset))


def data(start, stop, flip=False):
    chunk = FILE[start:stop]
    sent = bytes([chunk[0] ^ 1]) + chunk[1:] if flip else chunk
    return Checked(memoryview(sent), crc32c.crc32c(chunk))


END = pb.InitResponse(end=pb.FileEnd(index=0, sha256="sha"))


def events(*replicas):
    stubs = list(replicas)
    return ResumingEvents(Replicas(stubs, tuple(f"t{i}" for i in range(len(stubs))), "fp", None, reached={0, 1}),
                          pb.ModelRequest(), PLAN, None, 0, FAST, None)


def received(stream):
    return [(type(e).__name__, bytes(e.data) if isinstance(e, Data) else e) for e in stream]


def test_a_lost_server_is_resumed_on_the_next_replica_at_the_byte_reached(caplog):
    first = Replica([begin(), data(0, 5), Lost()])
    second = Replica([begin(5), data(5, 12), END])
    with caplog.at_level(logging.WARNING, logger="modelinit.client"):
        got = received(events(first, second))
    assert got == [("Begin", Begin(0, "f0", 12, 0)), ("Data", FILE[:5]), ("Data", FILE[5:]), ("End", End(0, "sha"))]
    assert first.asked == [(0, [])] and second.asked == [(5, [0])]
    assert "resuming f0 at byte 5 on t1" in [r.getMessage() for r in caplog.records]


def test_a_corrupted_message_is_asked_for_again_at_once_on_the_same_replica(caplog):
    only = Replica([begin(), data(0, 5), data(5, 9, flip=True)], [begin(5), data(5, 12), END])
    with caplog.at_level(logging.WARNING, logger="modelinit.client"):
        got = received(events(only))
    assert [b for kind, b in got if kind == "Data"] == [FILE[:5], FILE[5:]]
    assert only.asked == [(0, []), (5, [0])] and only.calls[0].cancelled
    said = [r.getMessage() for r in caplog.records]
    assert said == ["f0: the data after byte 5 failed its CRC32C (sent by t0); asking for it again"]


def test_a_resumed_stream_that_restates_another_byte_is_refused():
    with pytest.raises(ModelInitError) as e:
        received(events(Replica([begin(), data(0, 5), Lost()]), Replica([begin(7), data(7, 12), END])))
    assert e.value.code == grpc.StatusCode.DATA_LOSS
    assert e.value.details == "stream: resumed at file 0 byte 7, asked for file 0 byte 5"


def test_close_cancels_the_call():
    only = Replica([begin(), data(0, 5), data(5, 12), END])
    stream = events(only)
    it = iter(stream)
    next(it)
    stream.close()
    assert only.calls[0].cancelled
