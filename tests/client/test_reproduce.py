"""Reproducibility: one policy text format (policy files, modelinit.json, `plan/explain --json`),
``policy_file.to_dict`` as the exact inverse of ``from_dict``, old manifests still read, and
``init --from-manifest`` / ``modelinit.reproduce`` rewriting a run byte for byte."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import grpc
import modelinit
import pytest
import yaml
from google.protobuf import json_format
from hypothesis import given, settings
from hypothesis import strategies as st
from modelinit.cli import main
from modelinit.manifest import manifest_policy, manifest_request
from modelinit.verify import verify_folder
from modelinit_wire import policy_file
from modelinit_wire.v1 import modelinit_pb2 as pb

from tests.support import TINY, read_folder

# --- to_dict: the inverse of from_dict ---------------------------------------------------------

_names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_floats = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([0.0, -0.0, 1.0, 0.02, -2.0, 2.0])
_bound = _floats | st.sampled_from([math.inf, -math.inf])
_ints_or_floats = _floats | st.integers(-(2**53), 2**53)


def _params(**fields):
    """A mapping holding any subset of ``fields`` (each a strategy)."""
    return st.fixed_dictionaries({}, optional=fields)


_distributions = st.one_of(
    st.sampled_from(["zeros", "ones", "lecun_normal"]),
    st.builds(lambda v: {"constant": v}, _ints_or_floats),
    st.builds(lambda p: {"constant": p}, _params(value=_ints_or_floats)),
    st.builds(lambda p: {"normal": p}, _params(mean=_ints_or_floats, std=_ints_or_floats)),
    st.builds(lambda p: {"trunc_normal": p}, _params(mean=_floats, std=_floats, a=_bound, b=_bound,
                                                      bounds=st.sampled_from(["sigma", "absolute"]), preserve_std=st.booleans())),
    st.builds(lambda p: {"uniform": p}, _params(low=_ints_or_floats, high=_ints_or_floats)),
    st.builds(lambda k, p: {k: p}, st.sampled_from(["xavier_uniform", "xavier_normal"]), _params(gain=_floats)),
    st.builds(lambda k, p: {k: p}, st.sampled_from(["kaiming_uniform", "kaiming_normal"]),
              _params(negative_slope=_floats, mode=st.sampled_from(["fan_in", "fan_out", ""]),
                      nonlinearity=st.sampled_from(["leaky_relu", "relu", "linear", "tanh", ""]))),
    st.just({"lecun_normal": {}}),
)
_strings = st.lists(_names, max_size=3)
_matches = _params(kinds=_strings | _names, roles=_strings, params=_strings, names=_strings,
                   min_layer=st.integers(-(2**31), 2**31 - 1), max_layer=st.integers(-(2**31), 2**31 - 1))
_rules = st.fixed_dictionaries({"init": _distributions}, optional={
    "name": _names, "match": _matches, "depth_scaling": st.sampled_from(["none", "n_layers", "layer"]),
    "zero_padding_row": st.booleans()})
policy_docs = _params(preset=_names, rules=st.lists(_rules, max_size=4))


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(doc=policy_docs)
def test_to_dict_is_the_inverse_of_from_dict(doc):
    p = policy_file.from_dict(doc)
    d = policy_file.to_dict(p)
    assert policy_file.from_dict(d) == p
    assert policy_file.to_dict(policy_file.from_dict(d)) == d  # normal form: a fixed point
    # The normal form survives the files it is written to: modelinit.json (JSON) and policy files (YAML).
    assert policy_file.from_dict(json.loads(json.dumps(d))) == p
    assert policy_file.from_dict(yaml.safe_load(yaml.safe_dump(d))) == p


@settings(max_examples=200, deadline=None)
@given(doc=policy_docs)
def test_old_manifest_form_reads_as_the_same_policy(doc):
    """Manifests written before the policy-file format hold the proto3 JSON mapping."""
    p = policy_file.from_dict(doc)
    old = json.loads(json.dumps(json_format.MessageToDict(p, preserving_proto_field_name=True)))
    assert manifest_policy(old) == p
    assert manifest_policy(policy_file.to_dict(p)) == p


@pytest.mark.parametrize("doc, normal", [
    ({}, {}),
    ({"preset": "gpt2", "rules": []}, {"preset": "gpt2"}),
    ({"rules": [{"match": {}, "init": "zeros", "depth_scaling": "none", "zero_padding_row": False, "name": ""}]},
     {"rules": [{"init": {"constant": {"value": 0.0}}}]}),
    ({"rules": [{"init": "ones"}, {"init": {"constant": 0.5}}, {"init": "lecun_normal"}]},
     {"rules": [{"init": {"constant": {"value": 1.0}}}, {"init": {"constant": {"value": 0.5}}}, {"init": {"lecun_normal": {}}}]}),
    ({"rules": [{"name": "residual", "match": {"roles": "attn_out", "params": ["weight"], "min_layer": 0},
                 "init": {"normal": {"mean": 0, "std": 1}}, "depth_scaling": "n_layers"}]},
     {"rules": [{"name": "residual", "match": {"roles": ["attn_out"], "params": ["weight"], "min_layer": 0},
                 "init": {"normal": {"std": 1.0}}, "depth_scaling": "n_layers"}]}),
    ({"rules": [{"init": {"trunc_normal": {"std": 0.02, "a": -2, "bounds": "sigma", "preserve_std": False}}}]},
     {"rules": [{"init": {"trunc_normal": {"std": 0.02, "a": -2.0}}}]}),  # a given stays, even at its default
    ({"rules": [{"init": {"trunc_normal": {"std": 0.02, "b": 2, "bounds": "absolute", "preserve_std": True}}}]},
     {"rules": [{"init": {"trunc_normal": {"std": 0.02, "b": 2.0, "bounds": "absolute", "preserve_std": True}}}]}),
    ({"rules": [{"init": {"kaiming_normal": {"mode": "fan_in", "nonlinearity": "leaky_relu", "negative_slope": 0}}}]},
     {"rules": [{"init": {"kaiming_normal": {"mode": "fan_in", "nonlinearity": "leaky_relu"}}}]}),
])
def test_normal_form(doc, normal):
    assert policy_file.to_dict(policy_file.from_dict(doc)) == normal


def test_to_dict_of_messages_a_document_cannot_hold():
    # What the server ignores is dropped: a Kaiming gain, lecun_normal's parameters.
    p = pb.Policy(rules=[pb.Rule(init=pb.Distribution(kaiming_normal=pb.FanScaled(gain=3.0, mode="fan_out"))),
                         pb.Rule(init=pb.Distribution(lecun_normal=pb.FanScaled(mode="fan_out")))])
    assert policy_file.to_dict(p) == {"rules": [{"init": {"kaiming_normal": {"mode": "fan_out"}}}, {"init": {"lecun_normal": {}}}]}
    with pytest.raises(ValueError, match=r"policy.rules\[0\].init: missing"):
        policy_file.to_dict(pb.Policy(rules=[pb.Rule()]))
    with pytest.raises(ValueError, match=r"policy.rules\[0\].depth_scaling: unknown value 7"):
        policy_file.to_dict(pb.Policy(rules=[pb.Rule(init=pb.Distribution(constant=pb.Constant()), depth_scaling=7)]))


# --- one format everywhere --------------------------------------------------------------------

GPT2 = TINY["gpt2"]
POLICY_YAML = """
preset: hf-default
rules:
  - name: residual
    match: {roles: [attn_out, mlp_out], params: [weight], min_layer: 1}
    init: {normal: {std: 0.02}}
    depth_scaling: n_layers
  - name: tf-style
    match: {names: ["*.attn.c_attn.weight", "*.mlp.c_fc.weight"]}
    init: {trunc_normal: {std: 0.02, a: -2, b: 2, bounds: sigma, preserve_std: true}}
  - name: torch-style
    match: {kinds: [linear], params: [weight], max_layer: 0}
    init: {trunc_normal: {std: 0.02, a: -2, b: 2, bounds: absolute}}
    depth_scaling: layer
  - name: embeddings
    match: {kinds: [embedding]}
    init: lecun_normal
    zero_padding_row: true
"""


@pytest.fixture(scope="module")
def policy_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("policy") / "policy.yaml"
    path.write_text(POLICY_YAML)
    return path


@pytest.fixture(scope="module")
def recorded(embedded, policy_path, tmp_path_factory):
    """A sharded run with a custom policy file (depth scaling, trunc_normal, name globs)."""
    out = tmp_path_factory.mktemp("recorded") / "model"
    embedded.init_model(GPT2, seed=11, out_dir=out, policy=str(policy_path), dtype="bfloat16", max_shard_size="100KB")
    return out


def _manifest(folder):
    return json.loads((folder / "modelinit.json").read_text())


def test_manifest_records_the_policy_file_format(recorded, policy_path):
    policy = _manifest(recorded)["request"]["policy"]
    assert policy == policy_file.to_dict(policy_file.load(policy_path))
    assert policy["rules"][0]["depth_scaling"] == "n_layers" and policy["rules"][2]["init"]["trunc_normal"]["bounds"] == "absolute"
    assert "DEPTH_SCALING" not in json.dumps(policy) and "BOUNDS_" not in json.dumps(policy)


def test_manifest_policy_goes_back_to_policy(recorded, embedded, tmp_path):
    doc = _manifest(recorded)
    path = tmp_path / "again.json"
    path.write_text(json.dumps(doc["request"]["policy"]))
    plan = embedded.plan(GPT2, seed=11, policy=str(path), dtype="bfloat16")
    assert plan.fingerprint == doc["fingerprint"]


def _cli(*args):
    r = subprocess.run([sys.executable, "-m", "modelinit.cli", *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("command", ["plan", "explain"])
def test_json_outputs_print_the_policy_file_format(command, policy_path, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(GPT2))
    out = json.loads(_cli(command, str(cfg), "--policy", str(policy_path), "--json"))
    policy = out["request"]["policy"] if command == "plan" else out["policy"]
    assert policy == policy_file.to_dict(policy_file.load(policy_path))
    # ... and `--policy` takes it back: the same weights.
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(policy))
    fp = json.loads(_cli("plan", str(cfg), "--policy", str(again), "--json", "--no-tensors"))["fingerprint"]
    assert fp == json.loads(_cli("plan", str(cfg), "--policy", str(policy_path), "--json", "--no-tensors"))["fingerprint"]


def test_verify_reads_an_old_manifest(recorded, embedded, tmp_path):
    folder = tmp_path / "old"
    shutil.copytree(recorded, folder)
    doc = _manifest(folder)
    old = json_format.MessageToDict(policy_file.from_dict(doc["request"]["policy"]), preserving_proto_field_name=True)
    assert "DEPTH_SCALING_N_LAYERS" in json.dumps(old) and "BOUNDS_ABSOLUTE" in json.dumps(old)
    doc["request"]["policy"] = old
    (folder / "modelinit.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    report = verify_folder(folder, client=embedded)
    assert report.ok and report.regenerated, report.problems
    # An old manifest reproduces too (its own modelinit.json is rewritten in the new format).
    again = modelinit.reproduce(folder, tmp_path / "again", client=embedded)
    assert read_folder(again.path) == read_folder(recorded)


# --- init --from-manifest ---------------------------------------------------------------------


@pytest.mark.parametrize("where", ["folder", "file"])
def test_cli_from_manifest_is_byte_identical(recorded, tmp_path, where):
    source = recorded if where == "folder" else recorded / "modelinit.json"
    out = tmp_path / "new"
    _cli("init", "--from-manifest", str(source), "--out", str(out))
    assert read_folder(out) == read_folder(recorded)  # every shard, index, config.json and modelinit.json


def test_python_api_through_a_server(recorded, client, tmp_path):
    result = client.init_model_from_manifest(recorded, tmp_path / "a")
    assert result.fingerprint == _manifest(recorded)["fingerprint"] and not result.reused
    assert read_folder(tmp_path / "a") == read_folder(recorded)
    again = modelinit.reproduce(recorded / "modelinit.json", tmp_path / "a", client=client)
    assert again.reused  # already there, verified: nothing written


def test_reproduces_architecture_and_algorithm_version(embedded, tmp_path):
    first = tmp_path / "v1"
    embedded.init_model(TINY["bert"], seed=2**64 - 1, out_dir=first, architecture="BertModel", algorithm_version=1,
                        policy="megatron", max_shard_size=50_000)
    request = _manifest(first)["request"]
    assert request["architecture"] == "BertModel" and request["algorithm_version"] == 1
    modelinit.reproduce(first, tmp_path / "again", client=embedded)
    assert read_folder(tmp_path / "again") == read_folder(first)
    assert manifest_request(_manifest(tmp_path / "again")) == manifest_request(_manifest(first))


def test_a_plan_that_differs_is_refused_before_writing(recorded, embedded, tmp_path):
    folder = tmp_path / "tampered"
    shutil.copytree(recorded, folder)
    doc = _manifest(folder)
    doc["request"]["seed"] = 12
    (folder / "modelinit.json").write_text(json.dumps(doc))
    with pytest.raises(modelinit.ModelInitError) as e:
        embedded.init_model_from_manifest(folder, tmp_path / "out")
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and "cannot reproduce" in e.value.details
    assert "fingerprint" in e.value.details and not (tmp_path / "out").exists()


def _old_manifest(embedded, tmp_path, written_with, recorded: str):
    """A folder written with policy ``written_with`` whose manifest records ``recorded``, as an older
    release recorded it; the refusal to reproduce it and ``verify``'s report."""
    folder = tmp_path / "old"
    embedded.init_model(GPT2, seed=1, out_dir=folder, policy=written_with)
    doc = _manifest(folder)
    doc["request"]["policy"] = {"preset": recorded}
    (folder / "modelinit.json").write_text(json.dumps(doc))
    with pytest.raises(modelinit.ModelInitError) as e:
        embedded.init_model_from_manifest(folder, tmp_path / "out")
    return e.value.details, verify_folder(folder, client=embedded)


def test_old_kaiming_manifest_names_lecun_normal(embedded, tmp_path):
    """A folder made when `kaiming` meant LeCun normal: its bytes are `lecun-normal`'s."""
    refused, report = _old_manifest(embedded, tmp_path, "lecun-normal", "kaiming")
    assert "'lecun-normal'" in refused
    assert not report.ok and any("'lecun-normal'" in p for p in report.problems)


def test_old_torchtitan_manifest_of_a_tied_model_names_the_policy_that_regenerates_it(embedded, tmp_path):
    """A tied model made when `torchtitan-llama3` gave its token embedding N(0, 1): its bytes are the
    preset's plus one rule, which the refusal and `verify` name."""
    old = {"preset": "torchtitan-llama3", "rules": [{"match": {"roles": ["token_embedding"]}, "init": {"normal": {"std": 1}}}]}
    refused, report = _old_manifest(embedded, tmp_path, old, "torchtitan-llama3")
    assert "rules: [{match: {roles: [token_embedding]}, init: {normal: {std: 1}}}]" in refused
    assert not report.ok and any("used to give a tied token embedding N(0, 1)" in p for p in report.problems)


@pytest.mark.parametrize("args, needle", [
    (["init", "--out", "X"], "give SPEC (a preset or config.json) or --from-manifest PATH"),
    (["init", "gpt2", "--from-manifest", "M", "--out", "X"], "not both"),
    (["init", "--from-manifest", "M", "--seed", "0", "--out", "X"], "--seed cannot change it"),
    (["init", "--from-manifest", "M", "--policy", "gpt2", "--dtype", "float16", "--out", "X"], "--policy, --dtype"),
])
def test_cli_spec_or_manifest(args, needle, capsys, tmp_path):
    assert main([a.replace("X", str(tmp_path / "x")) for a in args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("modelinit: error: init: ") and needle in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_cli_missing_manifest_is_bad_input(tmp_path, capsys):
    assert main(["init", "--from-manifest", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "has no modelinit.json" in capsys.readouterr().err


def test_every_key_of_the_record_is_explained(embedded, tmp_path):
    """docs/determinism.md's table of modelinit.json names every key a run writes, the request's
    too (a user asking what "transformers_version": "" means finds it there)."""
    from tests.support import REPO

    doc = (REPO / "docs" / "determinism.md").read_text(encoding="utf-8")
    section = doc[doc.index("## 18. The record: modelinit.json"):doc.index("## Sources")]
    embedded.init_model(TINY["gpt2"], seed=1, out_dir=tmp_path, architecture="GPT2LMHeadModel")
    record = json.loads((tmp_path / "modelinit.json").read_text())
    for key in [*record, *record["request"], *record["files"][0]]:
        assert f"`{key}`" in section, key
    assert '`""` for a built-in family' in section and record["transformers_version"] == ""
