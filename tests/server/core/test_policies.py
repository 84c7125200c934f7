"""Policy rules: matching, modifiers, presets, and errors that name the problem."""
import dataclasses
import math

import pytest
from modelinit_server.architectures import from_config, from_preset
from modelinit_server.core.policies import Distribution, Match, Policy, Rule, resolve, truncated_std_factor
from modelinit_server.core.tensors import TensorSpec

from tests.support import TINY


def by_name(policy, model):
    return {t.name: r for t, r in zip(model.tensors, resolve(policy, model))}


def test_unmatched_tensor_is_an_error_naming_it():
    model = from_config(TINY["llama"])
    policy = Policy(rules=(Rule(Match(kinds=("linear",)), Distribution("normal", std=0.02)),))
    with pytest.raises(ValueError, match=r"no rule matches tensor 'model\.embed_tokens\.weight'"):
        resolve(policy, model)


def test_first_matching_rule_wins_and_own_rules_precede_the_preset():
    model = from_config(TINY["llama"])
    own = Rule(Match(names=("*.down_proj.weight",)), Distribution("normal", std=0.5), name="mine")
    r = by_name(Policy(preset="hf-default", rules=(own,)), model)
    assert r["model.layers.1.mlp.down_proj.weight"].rule == "mine"
    assert r["model.layers.1.mlp.down_proj.weight"].std == 0.5
    assert r["model.layers.1.mlp.up_proj.weight"].std == 0.02


def test_depth_scaling():
    model = from_config(TINY["llama"])
    rules = (
        Rule(Match(roles=("mlp_out",)), Distribution("normal", std=0.02), depth_scaling="layer"),
        Rule(Match(roles=("attn_out",)), Distribution("normal", std=0.02), depth_scaling="n_layers"),
    )
    r = by_name(Policy(preset="hf-default", rules=rules), model)
    assert r["model.layers.1.mlp.down_proj.weight"].std == 0.02 / math.sqrt(2 * 2)
    assert r["model.layers.0.self_attn.o_proj.weight"].std == 0.02 / math.sqrt(2 * model.n_layers)


def test_layer_range_matches_only_blocks():
    m = Match(min_layer=1, max_layer=1)
    model = from_config(TINY["llama"])
    hits = [t.name for t in model.tensors if m.selects(t)]
    assert hits and all(".layers.1." in n for n in hits)


def test_trunc_normal_effective_std():
    assert truncated_std_factor(-2.0, 2.0) == pytest.approx(0.87962566103423978, rel=1e-12)
    assert truncated_std_factor(-math.inf, math.inf) == pytest.approx(1.0)
    model = from_preset("bert-base-uncased")
    r = by_name(Policy(preset="bert-tf"), model)
    q = r["bert.encoder.layer.0.attention.self.query.weight"]
    assert q.effective_std == pytest.approx(0.0176, abs=1e-4)
    assert q.sampler.kind == "trunc_normal" and (q.sampler.a, q.sampler.b) == (-2.0, 2.0)


def test_absolute_bounds_are_converted_to_sigma():
    model = from_config(TINY["gpt2"])
    rule = Rule(Match(), Distribution("trunc_normal", std=0.02, a=-2.0, b=2.0, bounds="absolute"))
    r = resolve(Policy(rules=(rule,)), model)[0]
    assert (r.sampler.a, r.sampler.b) == (-100.0, 100.0)
    assert r.effective_std == pytest.approx(0.02)


def test_fan_based_kinds():
    model = from_config(TINY["llama"])
    rules = (Rule(Match(kinds=("linear",)), Distribution("xavier_uniform")),
             Rule(Match(), Distribution("kaiming_normal", mode="fan_in")))
    r = by_name(Policy(rules=rules), model)
    up = r["model.layers.0.mlp.up_proj.weight"]  # fan_in 64, fan_out 160
    assert up.sampler.high == pytest.approx(math.sqrt(6 / (64 + 160)))
    emb = r["model.embed_tokens.weight"]
    assert emb.std == pytest.approx(math.sqrt(2) / math.sqrt(emb.sampler.row_size))


@pytest.mark.parametrize("make, field", [
    (lambda: Distribution("gaussian"), "unknown distribution"),
    (lambda: Distribution("normal", std=-1), "std"),
    (lambda: Distribution("normal", std=float("nan")), "std"),
    (lambda: Distribution("trunc_normal", std=1, a=1, b=-1), "a=1"),
    (lambda: Distribution("uniform", low=1, high=0), "low"),
    (lambda: Match(kinds=("convolution",)), "match.kinds"),
    (lambda: Rule(Match(), Distribution("constant"), depth_scaling="layer"), "depth_scaling"),
    (lambda: Policy(preset="nope"), "policy.preset"),
])
def test_invalid_policies(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def test_preserve_std_rescales_to_the_requested_std():
    model = from_config(TINY["gpt2"])
    rule = Rule(Match(), Distribution("trunc_normal", std=0.02, a=-2.0, b=2.0, preserve_std=True))
    r = resolve(Policy(rules=(rule,)), model)[0]
    assert r.effective_std == pytest.approx(0.02, rel=1e-12)
    assert r.sampler.std == pytest.approx(0.02 / 0.87962566103423978, rel=1e-12)


def test_an_unmatched_tensor_names_the_policy_in_use_and_a_rule_that_fixes_it():
    """Not the circular 'use a preset such as hf-default' when the call was on hf-default: the
    preset in use, the presets that would cover the tensor, and a rule in the policy file's form."""
    model = from_config(TINY["llama"])
    only_linear = Policy(rules=(Rule(Match(kinds=("linear",)), Distribution("normal", std=0.02)),))
    with pytest.raises(ValueError) as e:
        resolve(only_linear, model)
    message = str(e.value)
    assert "under 1 rule(s) of its own and no preset" in message
    assert "presets that cover it: " in message and "hf-default" in message.split("presets that cover it: ")[1]
    assert '{"match": {"names": ["model.embed_tokens.weight"]}, "init": "zeros"}' in message
    on_default = Policy(preset="hf-default")
    plain = dataclasses.replace(model, tensors=model.tensors + (TensorSpec("scale", (4,), kind="other", role="other", param="weight"),))
    with pytest.raises(ValueError) as e:
        resolve(on_default, plain)
    assert "under preset 'hf-default'" in str(e.value) and "such as 'hf-default'" not in str(e.value)
