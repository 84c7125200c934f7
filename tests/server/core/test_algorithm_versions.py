"""Algorithm version 2 ("one backbone whatever the head") next to version 1: canonical names,
per-request versions through the wire, modelinit.json and verify, the CLI flags."""
from __future__ import annotations

import json
import struct
import subprocess
import sys

import grpc
import modelinit.client as mc
import pytest
from modelinit.errors import ModelInitError
from modelinit.manifest import manifest_request
from modelinit.verify import verify_folder
from modelinit_server.core.planner import Request, build_plan
from modelinit_server.core.policies import Policy
from modelinit_server.core.tensors import ModelSpec, TensorSpec
from modelinit_server.engine import generate
from modelinit_server.messages import request_from_pb
from modelinit_wire.v1 import modelinit_pb2 as pb
from modelinit_wire.v1 import modelinit_pb2_grpc as pb_grpc

from tests.support import TINY

# (config, base class, head class, the head class's base_model_prefix); every one a fast-path family.
PAIRS = {
    "bert": (TINY["bert"], "BertModel", "BertForMaskedLM", "bert"),
    "llama": (TINY["llama"], "LlamaModel", "LlamaForCausalLM", "model"),
    "gpt2": (TINY["gpt2"], "GPT2Model", "GPT2LMHeadModel", "transformer"),
}


def tensor_bytes(config: dict, architecture: str, version: int, seed: int = 11, dtype: str = "bfloat16") -> tuple:
    """(plan, {stored name: bytes}) of a config whose ``architectures`` names the class."""
    request = mc.model_request({**config, "architectures": [architecture]}, seed=seed, dtype=dtype, algorithm_version=version)
    plan = build_plan(request_from_pb(request))
    assert plan.request.model.architecture == architecture and plan.algorithm_version == version
    return plan, {t.spec.name: generate(t.sampler, t.key, 0, t.spec.numel, dtype) for t in plan.tensors}


def safetensors_tensors(path) -> tuple[dict, dict[str, bytes]]:
    """(metadata, {name: raw bytes}) of one safetensors file."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    body = data[8 + n :]
    meta = header.pop("__metadata__", {})
    return meta, {k: body[v["data_offsets"][0] : v["data_offsets"][1]] for k, v in header.items()}


# --------------------------------------------------------------------------------------------
# one backbone whatever the head
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", PAIRS)
def test_v2_base_and_head_class_share_the_backbone(family):
    config, base, head, prefix = PAIRS[family]
    base_plan, base_bytes = tensor_bytes(config, base, 2)
    head_plan, head_bytes = tensor_bytes(config, head, 2)
    assert base_plan.request.model.base_model_prefix == "" and head_plan.request.model.base_model_prefix == prefix
    backbone = [n for n in head_bytes if n.startswith(prefix + ".")]
    assert len(backbone) >= 10
    for name in backbone:
        canonical = name[len(prefix) + 1 :]
        assert canonical in base_bytes, name
        assert head_bytes[name] == base_bytes[canonical], name
    # and the head's own tensors keep their names (and their own keys)
    heads = [n for n in head_bytes if not n.startswith(prefix + ".")]
    assert heads or head_plan.request.model.tied
    for name in heads:
        assert name not in base_bytes or head_bytes[name] != base_bytes[name]


@pytest.mark.parametrize("family", PAIRS)
def test_v1_base_and_head_class_do_not_share_the_backbone(family):
    config, base, head, prefix = PAIRS[family]
    _, base_bytes = tensor_bytes(config, base, 1)
    _, head_bytes = tensor_bytes(config, head, 1)
    random = [n for n in head_bytes if n.startswith(prefix + ".") and len(set(head_bytes[n][i : i + 2] for i in range(0, 64, 2))) > 1]
    assert len(random) >= 5
    for name in random:  # full names key the tensors: every random backbone tensor differs
        assert head_bytes[name] != base_bytes[name[len(prefix) + 1 :]], name


def test_v2_shares_through_files_and_the_architecture_override(embedded, tmp_path):
    """End to end: BertForMaskedLM's folder and BertModel's (the same config, --architecture) hold
    the same backbone bytes under v2; the override is echoed and recorded."""
    config = {**TINY["bert"], "architectures": ["BertForMaskedLM"]}
    mlm = embedded.init_model(config, seed=5, out_dir=tmp_path / "mlm", dtype="float16")
    base = embedded.init_model(config, seed=5, out_dir=tmp_path / "base", dtype="float16", architecture="BertModel")
    assert mlm.algorithm_version == base.algorithm_version == 2
    meta_m, mlm_t = safetensors_tensors(tmp_path / "mlm" / "model.safetensors")
    meta_b, base_t = safetensors_tensors(tmp_path / "base" / "model.safetensors")
    assert meta_m["modelinit.algorithm_version"] == meta_b["modelinit.algorithm_version"] == "2"
    shared = [n for n in mlm_t if n.startswith("bert.")]
    assert shared and all(mlm_t[n] == base_t[n[len("bert."):]] for n in shared)
    assert "cls.predictions.transform.dense.weight" in mlm_t and "pooler.dense.weight" in base_t
    doc = json.loads((tmp_path / "base" / "modelinit.json").read_text())
    assert doc["architecture"] == "BertModel" and doc["request"]["architecture"] == "BertModel"
    assert doc["request"]["algorithm_version"] == 2 == doc["algorithm_version"]
    assert "architecture" not in json.loads((tmp_path / "mlm" / "modelinit.json").read_text())["request"]
    report = verify_folder(tmp_path / "base", client=embedded)
    assert report.ok and report.regenerated, report.problems


def test_v2_refuses_two_tensors_with_one_canonical_name():
    def t(name):
        return TensorSpec(name, (4, 4), "linear", "other", "weight", fan_in=4, fan_out=4)

    model = ModelSpec("custom", "Custom", {}, (t("model.w"), t("w")), 1, 4, 0.02, base_model_prefix="model")
    build_plan(Request(model, Policy(), seed=0, algorithm_version=1))  # full names: distinct keys
    with pytest.raises(ValueError, match="^algorithm_version: .*'model.w' and 'w'"):
        build_plan(Request(model, Policy(), seed=0, algorithm_version=2))


# --------------------------------------------------------------------------------------------
# the version on the wire
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 3, 7, True, "2"])
def test_request_validates_the_version(version):
    model = build_plan(request_from_pb(mc.model_request(TINY["gpt2"], seed=0))).request.model
    with pytest.raises(ValueError, match=r"^algorithm_version: unknown version .*; use 1 or 2 \(0 means the newest\)"):
        Request(model, Policy(), seed=0, algorithm_version=version)


def test_unknown_version_is_invalid_argument_from_a_real_server(server_target, client):
    with pytest.raises(ModelInitError) as e:
        client.plan(TINY["gpt2"], algorithm_version=3)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and e.value.details.startswith("algorithm_version:")
    request = mc.model_request(TINY["gpt2"], seed=0)
    request.algorithm_version = 99
    with grpc.insecure_channel(server_target) as ch:
        stub = pb_grpc.ModelInitStub(ch)
        for call in (lambda: stub.Plan(pb.PlanRequest(request=request), timeout=60),
                     lambda: list(stub.Init(pb.InitRequest(request=request), timeout=60))):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "algorithm_version" in err.value.details() and "99" in err.value.details()


def test_versions_through_a_real_server(client):
    newest = client.plan(TINY["gpt2"], seed=1)
    v2 = client.plan(TINY["gpt2"], seed=1, algorithm_version=2)
    v1 = client.plan(TINY["gpt2"], seed=1, algorithm_version=1)
    assert newest.algorithm_version == v2.algorithm_version == 2 and v1.algorithm_version == 1
    assert newest.request.algorithm_version == 2 and v1.request.algorithm_version == 1  # the echo is normalized
    assert newest.fingerprint == v2.fingerprint != v1.fingerprint
    assert newest.base_model_prefix == v1.base_model_prefix == "transformer"
    assert newest.transformers_version == ""  # the built-in fast path
    base = client.plan(TINY["gpt2"], seed=1, architecture="GPT2Model")
    assert base.architecture == "GPT2Model" and base.base_model_prefix == "" and base.request.spec.architecture == "GPT2Model"


def test_client_refuses_a_plan_of_another_version(monkeypatch, embedded):
    """A server that predates a version ignores the field and plans its own: the client refuses."""
    real = embedded.source.service.page

    def old_server(built, msg, *args, **kwargs):
        plan = real(built, msg, *args, **kwargs)
        plan.algorithm_version = 1
        return plan

    monkeypatch.setattr(embedded.source.service, "page", old_server)
    with pytest.raises(ModelInitError) as e:
        embedded.plan(TINY["gpt2"], algorithm_version=2)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and "algorithm_version" in e.value.details
    assert embedded.plan(TINY["gpt2"]).algorithm_version == 1  # no version asked: any is fine


@pytest.mark.parametrize("bad", [-1, 2**32, 1.0, True])
def test_model_request_checks_the_version(bad):
    with pytest.raises(ModelInitError) as e:
        mc.model_request("gpt2", seed=0, algorithm_version=bad)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "algorithm_version" in e.value.details


# --------------------------------------------------------------------------------------------
# modelinit.json and verify
# --------------------------------------------------------------------------------------------


def test_manifest_records_the_version_and_verify_replays_a_v1_folder(embedded, tmp_path):
    v1 = embedded.init_model(TINY["gpt2"], seed=9, out_dir=tmp_path / "v1", dtype="bfloat16", algorithm_version=1,
                             max_shard_size="200KB")
    v2 = embedded.init_model(TINY["gpt2"], seed=9, out_dir=tmp_path / "v2", dtype="bfloat16", max_shard_size="200KB")
    assert (v1.algorithm_version, v2.algorithm_version) == (1, 2) and v1.fingerprint != v2.fingerprint
    doc = json.loads((tmp_path / "v1" / "modelinit.json").read_text())
    assert doc["algorithm_version"] == 1 and doc["request"]["algorithm_version"] == 1
    assert doc["transformers_version"] == "" and "architecture" not in doc["request"]
    assert json.loads((tmp_path / "v2" / "modelinit.json").read_text())["request"]["algorithm_version"] == 2
    shard = sorted((tmp_path / "v1").glob("*.safetensors"))[0]
    assert safetensors_tensors(shard)[0]["modelinit.algorithm_version"] == "1"
    assert shard.read_bytes() != (tmp_path / "v2" / shard.name).read_bytes()

    report = verify_folder(tmp_path / "v1", client=embedded)
    assert report.ok and report.regenerated and report.algorithm_version == 1, report.problems
    # A rerun with the same version finds the folder complete; another version rewrites it.
    assert embedded.init_model(TINY["gpt2"], seed=9, out_dir=tmp_path / "v1", dtype="bfloat16", algorithm_version=1,
                               max_shard_size="200KB").reused

    # A manifest written before version 2 records the version only at the top level.
    del doc["request"]["algorithm_version"], doc["transformers_version"]
    (tmp_path / "v1" / "modelinit.json").write_text(json.dumps(doc, indent=2))
    assert manifest_request(doc).algorithm_version == 1
    report = verify_folder(tmp_path / "v1", client=embedded)
    assert report.ok and report.regenerated, report.problems


def test_manifest_versions_must_agree():
    doc = {"algorithm_version": 1, "request": {"spec": {"preset": "gpt2"}, "seed": 0, "max_shard_size": 5,
                                               "algorithm_version": 2}}
    with pytest.raises(ValueError, match="^request.algorithm_version: 2"):
        manifest_request(doc)
    doc["request"]["algorithm_version"] = 1
    doc["request"]["architecture"] = 5
    with pytest.raises(ValueError, match="^request.architecture"):
        manifest_request(doc)
    doc["request"]["architecture"] = "GPT2Model"
    assert manifest_request(doc).spec.architecture == "GPT2Model"


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def run(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "modelinit.cli", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_cli_flags(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY["bert"]))
    r = run("plan", str(cfg), "--json", "--algorithm-version", "1", "--architecture", "BertModel")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["algorithm_version"] == 1 and plan["architecture"] == "BertModel"
    assert plan["request"]["spec"]["architecture"] == "BertModel"
    r = run("init", str(cfg), "--out", str(tmp_path / "out"), "--algorithm-version", "1", "--quiet")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "out" / "modelinit.json").read_text())["request"]["algorithm_version"] == 1
    r = run("explain", str(cfg), "--algorithm-version", "3")
    assert r.returncode == 2 and "--algorithm-version" in r.stderr
    r = run("plan", str(cfg), "--architecture", "GPT2Model")
    assert r.returncode == 2 and "architecture" in r.stderr
