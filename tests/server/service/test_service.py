"""End to end through a real server and the real client: determinism, layout, errors."""
from __future__ import annotations

import hashlib
import json
import math
import threading

import grpc
import modelinit
import pytest
import torch
from modelinit_wire.v1 import modelinit_pb2 as pb
from modelinit_wire.v1 import modelinit_pb2_grpc as pb_grpc
from safetensors import safe_open

from tests.support import TINY, read_folder

GPT2 = TINY["gpt2"]


def tensor_bytes(folder) -> dict[str, bytes]:
    """Raw bytes of every tensor in a folder's shards, whatever the sharding."""
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                out[name] = t.contiguous().view(-1).view(dtype=torch.uint8).numpy().tobytes()
    return out


def test_same_request_twice_gives_identical_files(client, tmp_path):
    a = client.init_model(GPT2, seed=7, out_dir=tmp_path / "a", dtype="bfloat16", max_shard_size="100KB")
    b = client.init_model(GPT2, seed=7, out_dir=tmp_path / "b", dtype="bfloat16", max_shard_size="100KB")
    assert len([f for f in a.files if f.name.endswith(".safetensors")]) > 1
    assert read_folder(a.path) == read_folder(b.path)
    assert a.fingerprint == b.fingerprint


def test_output_is_the_hf_layout(client, tmp_path):
    res = client.init_model(GPT2, seed=1, out_dir=tmp_path, dtype="bfloat16", max_shard_size="100KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert sorted(set(index["weight_map"].values())) == shards
    assert shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    total = 0
    for shard in shards:
        with safe_open(tmp_path / shard, "pt") as f:
            meta = f.metadata()
            assert meta["format"] == "pt" and meta["modelinit.fingerprint"] == res.fingerprint
            assert meta["modelinit.seed"] == "1" and meta["modelinit.algorithm_version"] == "2" == str(res.algorithm_version)
            for name in f.keys():
                assert index["weight_map"][name] == shard
                t = f.get_tensor(name)
                total += t.numel() * t.element_size()
    assert index["metadata"]["total_size"] == total == res.total_bytes
    manifest = json.loads((tmp_path / "modelinit.json").read_text())
    assert manifest["fingerprint"] == res.fingerprint and manifest["request"]["seed"] == 1
    for entry in manifest["files"]:
        assert hashlib.sha256((tmp_path / entry["name"]).read_bytes()).hexdigest() == entry["sha256"]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["dtype"] == "bfloat16"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_shard_size_changes_files_not_tensor_bytes(client, tmp_path):
    one = client.init_model(GPT2, seed=3, out_dir=tmp_path / "one", dtype="float16")
    many = client.init_model(GPT2, seed=3, out_dir=tmp_path / "many", dtype="float16", max_shard_size="64KiB")
    assert len(one.files) < len(many.files)
    assert one.fingerprint == many.fingerprint
    assert tensor_bytes(one.path) == tensor_bytes(many.path)


def test_different_seed_gives_different_weights(client, tmp_path):
    a = tensor_bytes(client.init_model(GPT2, seed=1, out_dir=tmp_path / "a").path)
    b = tensor_bytes(client.init_model(GPT2, seed=2, out_dir=tmp_path / "b").path)
    random = [n for n in a if "ln_" not in n and not n.endswith("bias")]
    assert random and all(a[n] != b[n] for n in random)
    constant = [n for n in a if n not in random]
    assert constant and all(a[n] == b[n] for n in constant)


def test_embedded_and_separate_server_give_identical_bytes(tmp_path, server_process):
    proc = server_process()
    with modelinit.Client(proc.target) as remote:
        remote.init_model(TINY["llama"], seed=11, out_dir=tmp_path / "served", dtype="bfloat16", max_shard_size="200KB")
    with modelinit.Client() as embedded:
        embedded.init_model(TINY["llama"], seed=11, out_dir=tmp_path / "embedded", dtype="bfloat16", max_shard_size="200KB")
    assert read_folder(tmp_path / "served") == read_folder(tmp_path / "embedded")


def test_plan_matches_what_is_written(client, tmp_path):
    plan = client.plan(GPT2, seed=5, dtype="bfloat16", max_shard_size="100KB", tensors=True)
    res = client.init_model(GPT2, seed=5, out_dir=tmp_path, dtype="bfloat16", max_shard_size="100KB")
    assert [(f.name, f.size) for f in plan.files] == [(f.name, f.size) for f in res.files]
    assert plan.fingerprint == res.fingerprint
    assert plan.total_params == sum(math.prod(t.shape) for t in plan.tensors)
    assert plan.tied == {"lm_head.weight": "transformer.wte.weight"}
    c_proj = [t for t in plan.tensors if t.name.endswith("c_proj.weight")]
    assert c_proj and all(t.std == pytest.approx(0.02 / (2 * GPT2["n_layer"]) ** 0.5) for t in c_proj)


def _stream(target, request: pb.InitRequest) -> list[pb.InitResponse]:
    with grpc.insecure_channel(target) as ch:
        return list(pb_grpc.ModelInitStub(ch).Init(request))


def test_an_init_chunk_size_over_the_maximum_is_refused_naming_it(server_target):
    from modelinit_wire.constants import MAX_CHUNK

    req = modelinit.client.model_request(GPT2, seed=9)
    with pytest.raises(grpc.RpcError) as e:
        _stream(server_target, pb.InitRequest(request=req, chunk_size=MAX_CHUNK + 1))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == f"chunk_size: {MAX_CHUNK + 1} bytes is over the {MAX_CHUNK}-byte maximum; use 1048576 or 0"
    assert len(_stream(server_target, pb.InitRequest(request=req, chunk_size=MAX_CHUNK))) > 2


def test_resume_offset_and_subset_equal_the_full_stream(server_target, client):
    req = modelinit.client.model_request(GPT2, seed=9, dtype="bfloat16", max_shard_size="100KB")
    full = _stream(server_target, pb.InitRequest(request=req, chunk_size=10_000))
    files: dict[int, bytes] = {}
    ends = {}
    for m in full:
        if m.HasField("begin"):
            cur = m.begin.index
            files[cur] = b""
        elif m.HasField("end"):
            ends[m.end.index] = m.end.sha256
        else:
            assert len(m.data) <= 10_000
            files[cur] += m.data
    assert all(hashlib.sha256(files[i]).hexdigest() == ends[i] for i in files)
    for index, offset in [(1, 0), (1, 12345), (0, 7), (0, len(files[0]))]:
        part = _stream(server_target, pb.InitRequest(request=req, files=[index], offset=offset, chunk_size=3333))
        assert part[0].begin.offset == offset
        assert b"".join(m.data for m in part[1:-1]) == files[index][offset:]
        assert part[-1].end.sha256 == ends[index]


def test_offset_and_file_index_out_of_range(server_target):
    req = modelinit.client.model_request(GPT2, seed=9)
    with pytest.raises(grpc.RpcError) as e:
        _stream(server_target, pb.InitRequest(request=req, files=[99]))
    assert e.value.code() == grpc.StatusCode.OUT_OF_RANGE and "files" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        _stream(server_target, pb.InitRequest(request=req, offset=10**12))
    assert e.value.code() == grpc.StatusCode.OUT_OF_RANGE and "offset" in e.value.details()


BAD = [
    (dict(spec="no-such-model"), "spec.preset"),
    (dict(spec={"model_type": "gpt2", "n_embd": -5}), "n_embd"),
    (dict(spec={"model_type": "nope"}), "model_type"),
    (dict(spec="gpt2", dtype="float8"), "dtype"),
    (dict(spec="gpt2", max_shard_size="0"), "max_shard_size"),
    (dict(spec="gpt2", max_shard_size="lots"), "max_shard_size"),
    (dict(spec="gpt2", max_shard_size="-1GB"), "max_shard_size"),
    (dict(spec="gpt2", policy="no-such-policy"), "policy.preset"),
    (dict(spec={"model_type": "llama", "hidden_size": 2**40}), "hidden_size"),
]


@pytest.mark.parametrize("kwargs, field", BAD, ids=[b[1] + str(i) for i, b in enumerate(BAD)])
def test_bad_input_is_invalid_argument_and_writes_nothing(client, tmp_path, kwargs, field):
    with pytest.raises(modelinit.ModelInitError) as e:
        client.init_model(seed=0, out_dir=tmp_path / "out", **kwargs)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert field in e.value.details
    assert not (tmp_path / "out").exists()


def test_malformed_config_json_file(client, tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(modelinit.ModelInitError) as e:
        client.plan(str(bad))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "spec.config" in e.value.details


def test_negative_seed_is_refused_before_any_call(client, tmp_path):
    with pytest.raises(modelinit.ModelInitError) as e:
        client.init_model("gpt2", seed=-1, out_dir=tmp_path / "out")
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "seed" in e.value.details


def test_interrupted_stream_leaves_nothing_that_looks_complete(server_target, tmp_path):
    """Cancel mid-shard: no temp file, no index, no modelinit.json; only verified shards remain."""
    seen = threading.Event()

    def progress(n):
        if not seen.is_set():
            seen.set()
            raise KeyboardInterrupt  # what Ctrl-C looks like inside the write loop

    with modelinit.Client(server_target) as c, pytest.raises(KeyboardInterrupt):
        c.init_model(GPT2, seed=1, out_dir=tmp_path, max_shard_size="100KB", progress=progress)
    left = {p.name for p in tmp_path.iterdir()}
    assert not any(n.startswith(".") for n in left)
    assert "modelinit.json" not in left and "model.safetensors.index.json" not in left


def test_7b_streams_with_bounded_server_memory(server_process):
    """llama-2-7b is never materialized: stream ~48 MiB of it, then cancel; the server's peak RSS
    stays far below the model's 13.5 GB (bounded by chunk size x pipeline depth + runtime)."""
    proc = server_process()
    req = modelinit.client.model_request("llama-2-7b", seed=0, dtype="bfloat16")
    with grpc.insecure_channel(proc.target) as ch:
        call = pb_grpc.ModelInitStub(ch).Init(pb.InitRequest(request=req))
        got = 0
        for m in call:
            got += len(m.data)
            if got >= 48 << 20:
                call.cancel()
                break
    assert got >= 48 << 20
    assert proc.peak_rss_bytes() < 600 << 20


def test_70b_plans(client):
    plan = client.plan("llama-3-70b", dtype="bfloat16")
    assert 70e9 < plan.total_params < 71e9
    shards = [f for f in plan.files if f.shard]
    assert len(shards) >= math.ceil(plan.total_bytes / 5e9)
    assert all(f.size < 5e9 + 100_000 for f in shards)


def test_values_that_overflow_the_dtype_are_refused_at_plan_time(client):
    big = pb.Policy(preset="hf-default", rules=[pb.Rule(match=pb.Match(kinds=["norm"]), init=pb.Distribution(constant=pb.Constant(value=1e6)))])
    with pytest.raises(modelinit.ModelInitError) as e:
        client.plan(GPT2, policy=big, dtype="float16")
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and e.value.details.startswith("dtype: float16 cannot hold")
    assert client.plan(GPT2, policy=big, dtype="float32").total_params > 0


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_engine_writes_the_reference_bytes(tmp_path, device):
    """The embedded path on each available kernel gives the folder the numpy reference gives, one
    file at a time and three at once (three producers launching the kernel from their threads)."""
    from modelinit_server.engine import backends

    try:
        backends.select(device)
    except ValueError as e:
        pytest.skip(str(e))
    kwargs = dict(seed=21, dtype="bfloat16", max_shard_size="150KB")
    with modelinit.Client(device="reference") as c:
        c.init_model(TINY["qwen2"], out_dir=tmp_path / "reference", **kwargs)
    with modelinit.Client(device=device) as c:
        c.init_model(TINY["qwen2"], out_dir=tmp_path / device, parallel=1, **kwargs)
        c.init_model(TINY["qwen2"], out_dir=tmp_path / f"{device}-3", parallel=3, **kwargs)
    assert read_folder(tmp_path / "reference") == read_folder(tmp_path / device) == read_folder(tmp_path / f"{device}-3")


def test_fsync_writes_the_same_files(client, tmp_path):
    a = client.init_model(GPT2, seed=2, out_dir=tmp_path / "a", max_shard_size="100KB")
    b = client.init_model(GPT2, seed=2, out_dir=tmp_path / "b", max_shard_size="100KB", fsync=True)
    assert read_folder(a.path) == read_folder(b.path)
