"""A server the client must not trust: file names that escape the folder, bytes that do not match
their hash, streams that stop early. The client refuses and leaves nothing behind."""
from __future__ import annotations

import hashlib
from concurrent import futures

import grpc
import modelinit
import pytest
from modelinit import ModelInitError
from modelinit.client import RetryPolicy
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


def _init(target: str, out) -> None:
    with modelinit.Client(target, retry=RetryPolicy(deadline=0)) as c:
        c.init_model("gpt2", seed=0, out_dir=out)


@pytest.mark.parametrize("name", ["../evil.safetensors", "/tmp/evil.safetensors", "sub/dir.safetensors", "..", ".hidden",
                                  "a\\b.safetensors", "c:evil", ""])
def test_names_that_escape_the_folder_are_refused(hostile, tmp_path, name):
    out = tmp_path / "out"
    with pytest.raises(ModelInitError) as e:
        _init(hostile(Hostile(name=name)), out)
    assert e.value.code == grpc.StatusCode.DATA_LOSS and "unsafe file name" in e.value.details
    assert sorted(p.name for p in tmp_path.rglob("*")) == []  # not even the output folder was made


def test_a_stream_naming_another_file_than_the_plan_is_refused(hostile, tmp_path):
    with pytest.raises(ModelInitError) as e:
        _init(hostile(Hostile(begin_name="../evil.safetensors")), tmp_path / "out")
    assert e.value.code == grpc.StatusCode.DATA_LOSS
    assert not (tmp_path / "evil.safetensors").exists()
    assert list((tmp_path / "out").iterdir()) == []


def test_bytes_that_do_not_match_their_hash_are_not_kept(hostile, tmp_path):
    with pytest.raises(ModelInitError) as e:
        _init(hostile(Hostile(sha="0" * 64)), tmp_path)
    assert e.value.code == grpc.StatusCode.DATA_LOSS and "SHA-256" in e.value.details
    assert list(tmp_path.iterdir()) == []


def test_a_stream_that_stops_early_leaves_nothing(hostile, tmp_path):
    with pytest.raises(ModelInitError) as e:
        _init(hostile(Hostile(stop_after=100)), tmp_path)
    assert e.value.code == grpc.StatusCode.DATA_LOSS
    assert list(tmp_path.iterdir()) == []
