"""A server the client must not trust: file names that escape the folder, bytes that do not match
their hash, streams that stop early. The client refuses and leaves nothing behind."""
from __future__ import annotations

import grpc
import modelinit
import pytest
from modelinit import ModelInitError
from modelinit.client import RetryPolicy

from tests.support.hostile_server import Hostile


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
