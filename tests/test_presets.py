"""Init-policy presets: every preset resolves every tensor of every family to its documented std.

Expected stds are computed here, independently of the policy code, from the TensorSpec fields
and the model (the formulas in docs/policies.md).
"""
import math

import numpy as np
import pytest

from modelinit_server.architectures import from_config
from modelinit_server.engine import generate_array, tensor_key
from modelinit_server.policies import PRESETS, Policy, resolve
from tests.conftest import TINY

NEW_PRESETS = ["gpt2", "megatron", "torchtitan-llama3", "xavier", "kaiming", "small-init", "torch-trunc-normal"]


def _trunc_factor(a: float, b: float) -> float:
    """Std of N(0, 1) truncated to [a, b], from math.erf (independent of policies.truncated_std_factor)."""
    phi = lambda x: math.exp(-x * x / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    cdf = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731
    z = cdf(b) - cdf(a)
    m = (phi(a) - phi(b)) / z
    return math.sqrt(1 + (a * phi(a) - b * phi(b)) / z - m * m)


def _residual_out(t) -> bool:
    return t.kind == "linear" and t.role in ("attn_out", "mlp_out")


def expected_std(preset, t, model):
    """The documented effective std of tensor ``t`` under ``preset`` (0 for constants)."""
    if t.kind == "norm" or t.param == "bias":
        return 0.0
    if preset == "gpt2":
        return 0.02 / math.sqrt(2 * model.n_layers) if _residual_out(t) else 0.02
    if preset == "megatron":
        s = model.initializer_range
        return s / math.sqrt(2 * model.n_layers) if _residual_out(t) else s
    if preset == "torchtitan-llama3":
        if t.kind == "embedding":
            return 1.0
        if t.role == "lm_head":
            return model.hidden_size**-0.5 * _trunc_factor(-3, 3)
        if _residual_out(t) or t.name.endswith(".mlp.up_proj.weight"):
            return 0.02 / math.sqrt(2 * (t.layer + 1))  # ±2 absolute: ≥ ±100σ, untruncated
        return 0.02
    if preset == "xavier":
        return math.sqrt(2 / (t.fan_in + t.fan_out))
    if preset == "kaiming":
        return 1 / math.sqrt(t.fan_in)
    if preset == "small-init":
        return math.sqrt(2 / (5 * model.hidden_size))
    if preset == "torch-trunc-normal":
        return model.initializer_range
    raise AssertionError(preset)


MODELS = {family: from_config(cfg) for family, cfg in TINY.items()}


def test_presets_are_registered():
    assert set(NEW_PRESETS) <= set(PRESETS)
    for name in NEW_PRESETS:
        assert PRESETS[name].__doc__, f"preset {name} needs a docstring"


@pytest.mark.parametrize("family", sorted(TINY))
@pytest.mark.parametrize("preset", NEW_PRESETS)
def test_every_tensor_resolves_to_documented_std(preset, family):
    model = MODELS[family]
    resolved = resolve(Policy(preset=preset), model)  # raises on any unmatched tensor
    assert len(resolved) == len(model.tensors)
    for t, r in zip(model.tensors, resolved):
        want = expected_std(preset, t, model)
        if want == 0.0:
            value = 1.0 if (t.kind == "norm" and t.param == "weight") else 0.0
            assert r.sampler.kind == "constant" and r.sampler.value == value, t.name
            assert r.effective_std == 0.0
        else:
            assert r.effective_std == pytest.approx(want, rel=1e-12), (t.name, r.init)
            assert r.sampler.zero_row is None, t.name


def test_torchtitan_specifics():
    model = MODELS["llama"]
    r = {t.name: x for t, x in zip(model.tensors, resolve(Policy(preset="torchtitan-llama3"), model))}
    wo1 = r["model.layers.1.self_attn.o_proj.weight"]
    assert wo1.sampler.kind == "trunc_normal" and wo1.std == pytest.approx(0.02 / math.sqrt(4), rel=1e-15)
    assert wo1.sampler.a == pytest.approx(-2 / wo1.std) and wo1.sampler.b == pytest.approx(2 / wo1.std)
    # w1 (gate) is plain 0.02; w3 (up) is depth-initialized like w2.
    assert r["model.layers.1.mlp.gate_proj.weight"].std == 0.02
    assert r["model.layers.1.mlp.up_proj.weight"].std == pytest.approx(0.02 / 2, rel=1e-15)
    assert r["model.layers.0.mlp.down_proj.weight"].std == pytest.approx(0.02 / math.sqrt(2), rel=1e-15)
    head = r["lm_head.weight"]
    assert (head.sampler.a, head.sampler.b) == (-3.0, 3.0)
    assert head.std == pytest.approx(64**-0.5)
    assert head.effective_std == pytest.approx(64**-0.5 * 0.98657, rel=1e-5)
    assert r["model.embed_tokens.weight"].sampler.kind == "normal" and r["model.embed_tokens.weight"].std == 1.0


def test_torch_trunc_normal_bounds_are_absolute():
    model = MODELS["bert"]
    r = resolve(Policy(preset="torch-trunc-normal"), model)[0]
    assert r.sampler.kind == "trunc_normal" and (r.sampler.a, r.sampler.b) == (-100.0, 100.0)


# One or two tensors per preset: the generated values have the effective std.
SAMPLED = [
    ("gpt2", "gpt2", "transformer.h.2.mlp.c_proj.weight"),
    ("gpt2", "llama", "model.embed_tokens.weight"),
    ("megatron", "bert", "bert.encoder.layer.1.output.dense.weight"),
    ("torchtitan-llama3", "llama", "lm_head.weight"),
    ("torchtitan-llama3", "mistral", "model.layers.1.mlp.up_proj.weight"),
    ("xavier", "qwen2", "model.layers.0.mlp.gate_proj.weight"),
    ("xavier", "roberta", "roberta.embeddings.word_embeddings.weight"),
    ("kaiming", "gpt2", "transformer.h.0.mlp.c_proj.weight"),
    ("small-init", "roberta", "roberta.encoder.layer.0.intermediate.dense.weight"),
    ("torch-trunc-normal", "qwen2", "model.embed_tokens.weight"),
]


@pytest.mark.parametrize("preset, family, name", SAMPLED)
def test_generated_std_matches_effective_std(preset, family, name):
    model = MODELS[family]
    r = {t.name: (t, x) for t, x in zip(model.tensors, resolve(Policy(preset=preset), model))}
    t, res = r[name]
    x = generate_array(res.sampler, tensor_key(3, name), 0, t.numel, "float32").astype(np.float64)
    n = t.numel
    want = expected_std(preset, t, model)
    assert res.effective_std == pytest.approx(want, rel=1e-12)
    assert abs(x.std() / want - 1) < 6 / math.sqrt(2 * n), (name, x.std(), want)
    assert abs(x.mean()) < 6 * want / math.sqrt(n)
