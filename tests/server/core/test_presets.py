"""Init-policy presets: every preset resolves every tensor of every family to its documented std.

Expected stds are computed here, independently of the policy code, from the TensorSpec fields
and the model (the formulas in docs/policies.md).
"""
import math

import numpy as np
import pytest
from modelinit_server.architectures import from_config
from modelinit_server.core.policies import PRESETS, Policy, resolve
from modelinit_server.engine import generate_array, tensor_key

from tests.support import TINY

NEW_PRESETS = ["gpt2", "megatron", "torchtitan-llama3", "xavier", "kaiming", "lecun-normal", "small-init", "torch-trunc-normal"]


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
        head_stored = any(x.role == "lm_head" and x.param == "weight" for x in model.tensors)
        if t.kind == "embedding" and t.role == "token_embedding" and t.name in model.tied.values() and not head_stored:
            return model.hidden_size**-0.5 * _trunc_factor(-3, 3)  # it is the (tied) output layer too, as in torchtitan
        if t.kind == "embedding":
            return 1.0
        if t.role == "lm_head":
            return model.hidden_size**-0.5 * _trunc_factor(-3, 3)
        if _residual_out(t) or t.name.endswith(".mlp.up_proj.weight"):
            return 0.02 / math.sqrt(2 * (t.layer + 1))  # ±2 absolute: ≥ ±100σ, untruncated
        return 0.02
    if preset == "xavier":
        return math.sqrt(2 / (t.fan_in + t.fan_out))
    if preset == "kaiming":  # torch's kaiming_normal_(w) default: leaky_relu, negative_slope 0 -> gain sqrt(2)
        return math.sqrt(2 / t.fan_in)
    if preset == "lecun-normal":
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
    # Tied (qwen2): the embedding is the output layer too, and takes its law, as torchtitan's tied flavors do.
    tied = MODELS["qwen2"]
    embed = resolve(Policy(preset="torchtitan-llama3"), tied)[[t.name for t in tied.tensors].index("model.embed_tokens.weight")]
    assert embed.sampler.kind == "trunc_normal" and (embed.sampler.a, embed.sampler.b) == (-3.0, 3.0)
    assert embed.std == pytest.approx(64**-0.5) and embed.rule == "output (tied to the embedding)"


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
    ("kaiming", "llama", "model.layers.1.self_attn.q_proj.weight"),
    ("lecun-normal", "gpt2", "transformer.h.0.mlp.c_proj.weight"),
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


# Fingerprints of the `kaiming` preset before it was renamed `lecun-normal` (computed with that
# code, seed 3): the renamed preset makes the same bytes.
OLD_KAIMING = {
    "gpt2": "f968bf5bdb0df14d713f8201001158217435fa163c2c528f188ca8a4741cb1f0",
    "llama": "ec8d375392453697996589ba6fda75fc32d6d3a941254138722f9509362e2c3f",
    "bert": "601971ceed12c22186ce4fa5a820336c7fe7ec9e81416eb9b888d6bc41fbe132",
}


@pytest.mark.parametrize("family", sorted(OLD_KAIMING))
def test_lecun_normal_is_the_old_kaiming_byte_for_byte(family):
    from modelinit_server.core.planner import Request, build_plan

    assert build_plan(Request(MODELS[family], Policy(preset="lecun-normal"), seed=3)).fingerprint == OLD_KAIMING[family]
    assert build_plan(Request(MODELS[family], Policy(preset="kaiming"), seed=3)).fingerprint != OLD_KAIMING[family]


# Fingerprints of `torchtitan-llama3` before a tied embedding took the output's law (computed with that
# code, seed 3): the untied llama's is unchanged; the tied ones' are the preset's plus one rule giving
# the token embedding N(0, 1) back (what docs/policies.md and `verify` tell the owner of such a folder).
OLD_TORCHTITAN = {
    "gpt2": "7452638f36a5d2515d0651d0ec5fba5b5f5adeec1be3bcc01b7e7fce7c0f31d4",
    "qwen2": "6a15d455d50d14d9dbffe3e0a0a2548c0b52ea0999a79f7217b6908ba3bbb740",
    "bert": "c79a39d81d2aed8c6b952a17cfc07ad94d114ee0a09411a78a3849112808452d",
    "llama": "5e060c57da87e24a7453740984010d0c96dfd89dfed65884458dbc9e0b665e5c",
}
OLD_TORCHTITAN_POLICY = {"preset": "torchtitan-llama3",
                         "rules": [{"match": {"roles": ["token_embedding"]}, "init": {"normal": {"std": 1}}}]}


@pytest.mark.parametrize("family", sorted(OLD_TORCHTITAN))
def test_old_torchtitan_bytes_are_the_preset_plus_one_rule(family):
    from modelinit_server.core.planner import Request, build_plan
    from modelinit_server.messages import policy_from_pb
    from modelinit_wire import policy_file

    old = policy_from_pb(policy_file.from_arg(OLD_TORCHTITAN_POLICY))
    assert build_plan(Request(MODELS[family], old, seed=3)).fingerprint == OLD_TORCHTITAN[family]
    now = build_plan(Request(MODELS[family], Policy(preset="torchtitan-llama3"), seed=3)).fingerprint
    assert (now == OLD_TORCHTITAN[family]) == (family == "llama")  # only the tied models changed


def test_kaiming_is_torch_kaiming_normal_default():
    """``kaiming`` = ``torch.nn.init.kaiming_normal_(w)`` with its defaults (mode fan_in,
    nonlinearity leaky_relu, a=0): std = sqrt(2) / sqrt(fan_in), for nn.Linear weights [out, in]."""
    torch = pytest.importorskip("torch")
    model = MODELS["llama"]
    r = {t.name: (t, x) for t, x in zip(model.tensors, resolve(Policy(preset="kaiming"), model))}
    t, res = r["model.layers.0.mlp.down_proj.weight"]  # [64, 160]: fan_in 160
    w = torch.empty(t.shape)
    torch_std = torch.nn.init.calculate_gain("leaky_relu", 0) / math.sqrt(torch.nn.init._calculate_correct_fan(w, "fan_in"))
    assert torch_std == pytest.approx(math.sqrt(2 / 160), rel=1e-15)
    assert res.sampler.kind == "normal" and res.std == pytest.approx(torch_std, rel=1e-15)
    torch.manual_seed(0)
    big = torch.nn.init.kaiming_normal_(torch.empty(512, 160))  # torch's own draw has the same std
    assert float(big.std()) == pytest.approx(torch_std, rel=0.02)


def test_explain_shows_the_formula():
    from modelinit_server.architectures import from_preset
    from modelinit_server.core.explain import explain
    from modelinit_server.core.planner import Request, build_plan

    def formulas(preset):
        return {g.formula for g in explain(build_plan(Request(from_preset("gpt2"), Policy(preset=preset), seed=0)))}

    assert "kaiming_normal: std = gain/sqrt(fan_in) = sqrt(2)/sqrt(768) (gain of leaky_relu, negative_slope 0)" in formulas("kaiming")
    assert "kaiming_normal: std = gain/sqrt(fan_in) = 1/sqrt(768) (gain of linear)" in formulas("lecun-normal")
    assert "normal: std = 0.02/sqrt(2·n_layers) = 0.02/sqrt(2·12)" in formulas("gpt2")
    assert "xavier_uniform: bound = gain·sqrt(6/(fan_in+fan_out)) = 1·sqrt(6/(768+2304))" in formulas("xavier")
    assert "trunc_normal: std = 0.02, a=-2σ, b=2σ, eff. std = std·0.879626" in formulas("bert-tf")


def test_cli_explain_prints_the_formula_column():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "modelinit.cli", "explain", "gpt2", "--policy", "kaiming"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[1].split()[-1] == "formula"
    assert any(line.startswith("kaiming_normal") and line.endswith("= sqrt(2)/sqrt(768) (gain of leaky_relu, negative_slope 0)")
               for line in lines)
