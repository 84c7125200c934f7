"""A server the client must not trust, for the tests of the client's refusals: :class:`Hostile`, a
servicer that plans one file and then sends a name that escapes the folder, bytes that do not match
their hash or a stream that stops early; and ``hostile`` (a fixture, registered in
tests/conftest.py), which starts any servicer on a free loopback port and stops it after the test."""
from __future__ import annotations

import hashlib
from concurrent import futures

import grpc
import pytest
from modelinit_wire.v1 import modelinit_pb2 as pb
from modelinit_wire.v1 import modelinit_pb2_grpc as pb_grpc

PAYLOAD = b"not really safetensors" * 100


class Hostile(pb_grpc.ModelInitServicer):
    def __init__(self, name: str = "model.safetensors", sha: str | None = None, stop_after: int | None = None,
                 begin_name: str | None = None) -> None:
        self.name, self.sha, self.stop_after, self.begin_name = name, sha, stop_after, begin_name

    def Plan(self, request, context):
        return pb.PlanResponse(algorithm_version=1, fingerprint="f" * 64, request=request.request,
                               files=[pb.FilePlan(name=self.name, size=len(PAYLOAD), shard=True)])

    def Init(self, request, context):
        yield pb.InitResponse(begin=pb.FileBegin(index=0, name=self.begin_name or self.name, size=len(PAYLOAD)))
        data = PAYLOAD if self.stop_after is None else PAYLOAD[: self.stop_after]
        yield pb.InitResponse(data=data)
        if self.stop_after is not None:
            return
        yield pb.InitResponse(end=pb.FileEnd(index=0, sha256=self.sha or hashlib.sha256(PAYLOAD).hexdigest()))


@pytest.fixture()
def hostile():
    servers = []

    def start(servicer: Hostile) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(2))
        pb_grpc.add_ModelInitServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for s in servers:
        s.stop(None)
