"""Policies from JSON/YAML files and dicts: they reach the server as rules and change the plan;
malformed documents are refused with the field's path."""
import json
import math

import grpc
import modelinit
import pytest
from modelinit_wire import policy_file

from tests.support import TINY

YAML = """
preset: hf-default
rules:
  - name: residual
    match: {roles: [attn_out, mlp_out]}
    init: {normal: {std: 0.02}}
    depth_scaling: n_layers
  - name: tf-style
    match: {kinds: [linear], params: [weight]}
    init: {trunc_normal: {std: 0.02, a: -2, b: 2}}
  - match: {names: ["*.embed_tokens.weight"]}
    init: lecun_normal
"""


def test_yaml_file_drives_the_plan(client, tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(YAML)
    plan = client.plan(TINY["llama"], policy=str(path), tensors=True)
    by = {t.name: t for t in plan.tensors}
    down = by["model.layers.1.mlp.down_proj.weight"]
    assert down.rule == "residual" and down.std == pytest.approx(0.02 / math.sqrt(2 * 2))
    q = by["model.layers.0.self_attn.q_proj.weight"]
    assert q.rule == "tf-style" and q.effective_std == pytest.approx(0.02 * 0.87962566103423978, rel=1e-9)
    emb = by["model.embed_tokens.weight"]
    assert emb.std == pytest.approx(1 / math.sqrt(64))  # LeCun: 1/sqrt(fan_in), fan_in = embedding dim
    assert by["model.norm.weight"].rule == "norm weight = 1"  # the preset's rules come after


def test_json_file_and_dict_give_the_same_request(tmp_path):
    doc = {"rules": [{"match": {}, "init": {"uniform": {"low": -0.1, "high": 0.1}}}]}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    assert policy_file.load(path) == policy_file.from_dict(doc)
    assert modelinit.client.model_policy(str(path)) == modelinit.client.model_policy(doc)


def test_cli_takes_a_policy_file(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "p.yaml"
    path.write_text("rules:\n  - init: {normal: {std: 0.5}}\n")
    r = subprocess.run([sys.executable, "-m", "modelinit.cli", "plan", "gpt2", "--policy", str(path), "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert {t["std"] for t in json.loads(r.stdout)["tensors"]} == {0.5}


@pytest.mark.parametrize("doc, where", [
    ([], "policy: must be a mapping"),
    ({"rule": []}, "policy: unknown key 'rule'"),
    ({"rules": [{"match": {}}]}, "policy.rules[0].init: missing"),
    ({"rules": [{"init": "twos"}]}, "policy.rules[0].init: unknown shorthand 'twos'"),
    ({"rules": [{"init": {"normal": {"sd": 1}}}]}, "policy.rules[0].init.normal: unknown key 'sd'"),
    ({"rules": [{"init": {"normal": {"std": "big"}}}]}, "policy.rules[0].init.normal.std: must be a number"),
    ({"rules": [{"init": {"normal": {}, "uniform": {}}}]}, "policy.rules[0].init: give exactly one"),
    ({"rules": [{"init": "zeros", "match": {"kinds": [1]}}]}, "policy.rules[0].match.kinds: must be a list of strings"),
    ({"rules": [{"init": "zeros", "match": {"min_layer": "x"}}]}, "policy.rules[0].match.min_layer"),
    ({"rules": [{"init": "zeros", "depth_scaling": "deep"}]}, "policy.rules[0].depth_scaling"),
    ({"rules": [{"init": {"trunc_normal": {"std": 1, "bounds": "wide"}}}]}, "policy.rules[0].init.trunc_normal.bounds"),
])
def test_malformed_documents_name_the_field(doc, where):
    with pytest.raises(ValueError) as e:
        policy_file.from_dict(doc)
    assert str(e.value).startswith(where)


def test_bad_values_are_refused_by_the_server_naming_the_rule(client):
    with pytest.raises(modelinit.ModelInitError) as e:
        client.plan("gpt2", policy={"rules": [{"name": "oops", "init": {"normal": {"std": -1}}}]})
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "policy.rules[0] (oops)" in e.value.details and "std" in e.value.details


def test_unmatched_tensor_names_it(client):
    with pytest.raises(modelinit.ModelInitError) as e:
        client.plan("gpt2", policy={"rules": [{"match": {"kinds": ["linear"]}, "init": "zeros"}]})
    assert "no rule matches tensor 'transformer.wte.weight'" in e.value.details


def test_malformed_yaml_and_missing_file(client, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules: [ {init: \n")
    for policy, needle in [(str(bad), "not valid YAML"), (str(tmp_path / "none.yaml"), "cannot read policy file")]:
        with pytest.raises(modelinit.ModelInitError) as e:
            client.plan("gpt2", policy=policy)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and needle in e.value.details


def test_typed_policy_objects(client):
    policy = modelinit.Policy(preset="hf-default", rules=[
        modelinit.Rule(name="lecun", match=modelinit.Match(kinds=["linear"], params=["weight"]),
                       init=modelinit.Distribution(lecun_normal=modelinit.FanScaled())),
    ])
    plan = client.plan(TINY["llama"], policy=policy, tensors=True)
    up = next(t for t in plan.tensors if t.name == "model.layers.0.mlp.up_proj.weight")  # fan_in 64
    assert up.rule == "lecun" and up.std == pytest.approx(1 / 8) and up.init.startswith("kaiming_normal")
