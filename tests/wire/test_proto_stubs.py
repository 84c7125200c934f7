"""The committed stubs are exactly what the pinned grpcio-tools generates from proto/."""
import importlib.util

import pytest

from tests.support import REPO


def test_committed_stubs_match_proto(tmp_path):
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpcio-tools not installed (it is in the test extra)")
    spec = importlib.util.spec_from_file_location("generate", REPO / "proto" / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    gen.generate(tmp_path)
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*_pb2*.py*"))
    assert fresh, "protoc produced nothing"
    for rel in fresh:
        committed = REPO / "proto" / rel
        assert committed.read_bytes() == (tmp_path / rel).read_bytes(), (
            f"{rel} is stale: run `python proto/generate.py` and commit the result"
        )
