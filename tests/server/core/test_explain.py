"""explain: tensor groups, reference stds and ratios, and the warnings for inits likely to fail."""
import json
import math
import subprocess
import sys

import pytest
from modelinit_server.architectures import from_config, from_preset
from modelinit_server.core.explain import distribution_mean, explain
from modelinit_server.core.planner import Request, build_plan
from modelinit_server.core.policies import Distribution, Match, Policy, Rule

from tests.support import TINY


def groups_of(model, policy):
    return explain(build_plan(Request(model, policy, seed=0)))


def warnings_of(groups, kind=None, param=None):
    return [w for g in groups if kind in (None, g.kind) and param in (None, g.param) for w in g.warnings]


def test_bert_tf_is_about_half_the_fan_in_references():
    groups = groups_of(from_preset("bert-base-uncased"), Policy(preset="bert-tf"))
    square = [g for g in groups if g.kind == "linear" and g.param == "weight" and g.shape == (768, 768)]
    assert len(square) == 1
    g = square[0]
    assert g.example == "bert.encoder.layer.0.attention.self.query.weight"
    assert {"qkv", "attn_out"} <= set(g.roles) and g.count == 12 * 4 + 2  # + the MLM head transform and the pooler (the hub checkpoint holds it)
    assert g.effective_std == pytest.approx(0.0176, abs=1e-4) and g.std == 0.02 and g.mean == 0.0
    assert g.xavier_std == pytest.approx(math.sqrt(2 / 1536)) == pytest.approx(0.0361, abs=1e-4)
    assert g.lecun_std == pytest.approx(1 / math.sqrt(768)) == pytest.approx(0.0361, abs=1e-4)
    assert g.ratio_lecun == pytest.approx(0.4875, abs=1e-3) and g.ratio_xavier == pytest.approx(g.ratio_lecun)
    assert not warnings_of(groups)


def test_groups_cover_every_tensor_in_first_appearance_order():
    model = from_config(TINY["bert"])
    plan = build_plan(Request(model, Policy(), seed=0))
    groups = explain(plan)
    assert sum(g.count for g in groups) == len(plan.tensors)
    assert sum(g.params for g in groups) == plan.total_params
    firsts = [g.example for g in groups]
    order = [t.spec.name for t in plan.tensors]
    assert firsts == sorted(firsts, key=order.index)
    norm = next(g for g in groups if g.kind == "norm" and g.param == "weight")
    assert (norm.xavier_std, norm.lecun_std, norm.ratio_lecun, norm.effective_std, norm.mean) == (0, 0, 0, 0, 1.0)


def test_hf_default_bert_has_no_warnings():
    groups = groups_of(from_preset("bert-base-uncased"), Policy(preset="hf-default"))
    linear = [g for g in groups if g.kind == "linear" and g.param == "weight"]
    assert linear and all(0.1 <= g.ratio_lecun <= 4 for g in linear)
    assert sum(len(g.warnings) for g in groups) == 0


def test_uniform_0_1_everywhere_warns_about_mean_norms_and_biases():
    policy = Policy(rules=(Rule(Match(), Distribution("uniform", low=0.0, high=1.0)),))
    groups = groups_of(from_config(TINY["llama"]), policy)
    assert any("non-zero mean 0.5" in w and "torch.rand" in w for w in warnings_of(groups, "linear", "weight"))
    assert any("norm weight is not constant 1" in w for w in warnings_of(groups, "norm", "weight"))
    assert not any("non-zero mean" in w for w in warnings_of(groups, "norm", "weight"))  # norm gains have mean 1
    bert = groups_of(from_config(TINY["bert"]), policy)
    assert any("bias is not 0" in w for w in warnings_of(bert, param="bias"))


def test_torch_trunc_normal_truncates_nothing():
    groups = groups_of(from_config(TINY["gpt2"]), Policy(preset="torch-trunc-normal"))
    weights = [g for g in groups if g.param == "weight" and g.kind != "norm"]
    assert weights and all(any("±100σ truncate nothing" in w for w in g.warnings) for g in weights)
    # bert-tf's ±2σ does truncate: no warning.
    assert not warnings_of(groups_of(from_config(TINY["gpt2"]), Policy(preset="bert-tf")))


def test_std_far_from_fan_in_warns_for_linear_only():
    rule = Rule(Match(kinds=("linear",), params=("weight",)), Distribution("normal", std=1.0), name="big")
    groups = groups_of(from_config(TINY["llama"]), Policy(preset="hf-default", rules=(rule,)))
    q = next(g for g in groups if g.example == "model.layers.0.self_attn.q_proj.weight")
    assert q.ratio_lecun == pytest.approx(8.0)
    assert any("8x the fan-in reference" in w for w in q.warnings)
    # N(0, 1) embeddings (torchtitan) are deliberate: no ratio warning for embeddings.
    tt = groups_of(from_config(TINY["llama"]), Policy(preset="torchtitan-llama3"))
    emb = next(g for g in tt if g.kind == "embedding")
    assert emb.ratio_lecun == pytest.approx(8.0) and not any("fan-in" in w for w in emb.warnings)


def test_norm_weights_at_half_warn():
    rule = Rule(Match(kinds=("norm",), params=("weight",)), Distribution("constant", value=0.5), name="half")
    groups = groups_of(from_config(TINY["llama"]), Policy(preset="hf-default", rules=(rule,)))
    assert warnings_of(groups, "norm", "weight") and len(warnings_of(groups)) == len(warnings_of(groups, "norm", "weight"))


def test_truncated_mean_is_analytic():
    from modelinit_server.engine import Sampler

    # N(0, 1) truncated to [0, inf): mean sqrt(2 / pi).
    assert distribution_mean(Sampler("trunc_normal", std=1.0, a=0.0)) == pytest.approx(math.sqrt(2 / math.pi))
    assert distribution_mean(Sampler("uniform", low=-1.0, high=3.0)) == 1.0


def test_plan_response_carries_the_groups(client):
    plan = client.plan("bert-base-uncased", policy="bert-tf")
    g = next(g for g in plan.groups if g.kind == "linear" and list(g.shape) == [768, 768])
    assert g.effective_std == pytest.approx(0.0176, abs=1e-4) and g.ratio_lecun == pytest.approx(0.4875, abs=1e-3)
    assert sum(g.count for g in plan.groups) == plan.tensor_count
    bad = client.plan(TINY["gpt2"], policy={"rules": [{"match": {}, "init": {"uniform": {"low": 0, "high": 1}}}]})
    assert any(g.warnings for g in bad.groups)



def test_cli_rows_of_one_rule_and_shape_are_told_apart_by_their_first_tensor():
    """bert-tf: the token-type embedding and the NSP head are both 'weight 1 x 2x768'."""
    r = run("explain", "bert-base-uncased", "--policy", "bert-tf")
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if " 1 x 2x768 " in line]
    assert len(rows) == 2 and rows[0] != rows[1]
    assert "bert.embeddings.token_type_embeddings.weight" in rows[0] and "cls.seq_relationship.weight" in rows[1]


def run(*args):
    return subprocess.run([sys.executable, "-m", "modelinit.cli", *args], capture_output=True, text=True, timeout=120)


def test_cli_table_warnings_and_json():
    r = run("explain", "gpt2", "--policy", "torch-trunc-normal")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[1].split() == ["rule", "tensors", "first", "tensor", "init", "eff.", "std", "xavier", "std", "lecun", "std",
                                "std/lecun", "formula"]  # every column labeled (the ratio's was 'ratio')
    assert any(line.startswith("xavier std = sqrt(2/(fan_in+fan_out)); lecun std = 1/sqrt(fan_in)") for line in lines)
    assert any("100σ" in line and line.startswith("  weight [") for line in lines)
    assert "124,439,808 parameters" in lines[-1] and "6 warning(s)" in lines[-1]
    r = run("explain", "gpt2", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["summary"] == {"total_params": 124_439_808, "groups": len(doc["groups"]), "warnings": 0}
    assert doc["groups"] and all(list(g) == list(doc["groups"][0]) for g in doc["groups"])
    assert doc["groups"][0]["warnings"] == []


def test_explain_and_plan_offer_only_the_flags_that_apply():
    """explain shows no shards and generates nothing; plan shows shards and generates nothing."""
    explain, plan, init = (run(command, "--help").stdout for command in ("explain", "plan", "init"))
    for flag in ("--max-shard-size", "--rehash", "--device"):
        assert flag not in explain and flag in init
    assert "--max-shard-size" in plan and "--rehash" not in plan and "--device" not in plan
    refused = run("explain", "gpt2", "--max-shard-size", "1GB")
    assert refused.returncode == 2 and "unrecognized arguments: --max-shard-size" in refused.stderr



def test_explain_of_mup_states_its_learning_rates():
    """µP is an init and learning rates: explain shows the half the weights do not hold (the rule
    the coordinate check applies, docs/probe.md); other policies print no such line."""
    mup = run("explain", "gpt2", "--policy", "mup")
    assert mup.returncode == 0, mup.stderr
    line = next(x for x in mup.stdout.splitlines() if x.startswith("learning rates (µP"))
    assert "Adam: hidden matrices LR · 256/width" in line and "SGD: hidden matrices LR, vector-like LR · width/256" in line
    assert "learning rates" not in run("explain", "gpt2").stdout
