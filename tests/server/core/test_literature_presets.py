"""The literature's presets (olmo2, gpt-neox, deepnet, mup): each tensor's std from its formula and
source, parameterized from the spec (width, depth, encoder/decoder); µP against the ``mup``
package's own initialization; every preset's measured signal through a stack of linear layers
against its analytic std (explain's numbers)."""
from __future__ import annotations

import math

import pytest
import torch
from modelinit_server.architectures import from_config
from modelinit_server.core import policies
from modelinit_server.core.policies.presets import MUP_BASE_WIDTH, deepnet_betas

from tests.support.stacks import install_mup

torch.set_num_threads(2)

LLAMA = {"model_type": "llama", "vocab_size": 512, "hidden_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 256, "tie_word_embeddings": False}
BERT = {"model_type": "bert", "vocab_size": 512, "hidden_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
        "intermediate_size": 256, "max_position_embeddings": 64}
BART = {"model_type": "bart", "vocab_size": 512, "d_model": 128, "encoder_layers": 6, "decoder_layers": 3,
        "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 256, "decoder_ffn_dim": 256,
        "max_position_embeddings": 64}


def resolved(config: dict, preset: str) -> dict[str, policies.Resolved]:
    spec = from_config(config)
    return {t.name: r for t, r in zip(spec.tensors, policies.resolve(policies.Policy(preset=preset), spec))}


def xavier_std(shape, gain: float) -> float:
    fan_out, fan_in = shape[0], math.prod(shape[1:])
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


def test_olmo2_is_0_02_truncated_at_3_sigma_everywhere():
    for name, r in resolved(LLAMA, "olmo2").items():
        s = r.sampler
        if name.endswith("norm.weight"):
            assert (s.kind, s.value) == ("constant", 1.0)
        else:
            assert (s.kind, s.std, s.a, s.b) == ("trunc_normal", 0.02, -3.0, 3.0), name
            assert r.effective_std == pytest.approx(0.02 * 0.98658, rel=1e-4)


def test_gpt_neox_small_init_and_wang_init():
    d, layers = LLAMA["hidden_size"], LLAMA["num_hidden_layers"]
    for name, r in resolved(LLAMA, "gpt-neox").items():
        if name.endswith("norm.weight"):
            continue
        want = 2 / (layers * math.sqrt(d)) if name.endswith(("o_proj.weight", "down_proj.weight")) else math.sqrt(2 / (5 * d))
        assert r.sampler.std == pytest.approx(want, rel=1e-12), name


@pytest.mark.parametrize(("config", "kind"), [(BERT, "encoder-only"), (LLAMA, "decoder-only"), (BART, "encoder-decoder")])
def test_deepnet_betas_follow_the_depth(config, kind):
    spec = from_config(config)
    got_kind, alphas, betas = deepnet_betas(spec)
    assert got_kind == kind
    if kind == "encoder-decoder":
        n, m = 6, 3
        assert betas == pytest.approx({"encoder": 0.87 * (n**4 * m) ** (-1 / 16), "decoder": (12 * m) ** -0.25})
        assert alphas == pytest.approx({"encoder": 0.81 * (n**4 * m) ** (1 / 16), "decoder": (3 * m) ** 0.25})
    else:
        assert betas == pytest.approx({"": (8 * 6) ** -0.25}) and alphas == pytest.approx({"": (2 * 6) ** 0.25})
    rs = resolved(config, "deepnet")
    d = spec.hidden_size
    for t in spec.tensors:
        r = rs[t.name]
        if t.param == "weight" and (t.kind == "embedding" or t.role == "lm_head"):
            assert r.sampler.std == pytest.approx(d**-0.5), t.name
            continue
        if t.kind != "linear" or t.param != "weight" or t.role == "lm_head":
            continue
        stack = "encoder" if "encoder." in t.name else "decoder" if "decoder." in t.name else ""
        beta = betas.get(stack, betas.get(""))
        scaled = t.role in ("attn_out", "mlp_in", "mlp_out") or t.name.endswith(("v_proj.weight", "value.weight"))
        if t.role not in ("qkv", "attn_out", "mlp_in", "mlp_out"):
            scaled = False
        want = xavier_std(t.shape, beta if scaled else 1.0)
        assert r.sampler.std == pytest.approx(want, rel=1e-12), (t.name, t.role)


def test_mup_scales_hidden_matrices_from_the_base_width_and_zeroes_readout_and_query():
    sigma = 0.02
    rs = resolved(dict(LLAMA, initializer_range=sigma), "mup")
    hidden = sigma * math.sqrt(MUP_BASE_WIDTH / LLAMA["hidden_size"])
    for name, r in rs.items():
        s = r.sampler
        if name.endswith(("q_proj.weight", "lm_head.weight")):
            assert (s.kind, s.value) == ("constant", 0.0), name
        elif name.endswith("embed_tokens.weight"):
            assert s.std == sigma
        elif name.endswith("norm.weight"):
            assert s.value == 1.0
        else:
            assert s.std == pytest.approx(hidden, rel=1e-12), name


@pytest.mark.slow
def test_mup_preset_matches_the_mup_package():
    """The same Llama shapes at width 512 (base 256): mup.init.normal_(w, std=0.02) after set_base_shapes
    gives every hidden matrix std 0.02·(512/256)^-1/2 and every vector-like weight 0.02; the preset's
    std for each tensor is within sampling tolerance of the package's sample std. Needs
    ``pip install --no-deps mup`` (its declared torchvision would replace the CPU torch)."""
    mup = install_mup()  # tests/support/stacks.py: pinned, without its declared torchvision
    import transformers

    def model(width: int):  # the base model: mup wants its own MuReadout for a head
        cfg = transformers.LlamaConfig(**dict(LLAMA, hidden_size=width, intermediate_size=2 * width, num_attention_heads=4,
                                               head_dim=width // 4))
        return transformers.LlamaModel(cfg)

    torch.manual_seed(0)
    target, base, delta = model(512), model(MUP_BASE_WIDTH), model(384)
    mup.set_base_shapes(target, base, delta=delta)
    config = dict(LLAMA, hidden_size=512, intermediate_size=1024, head_dim=128, initializer_range=0.02)
    spec = from_config(config, "LlamaModel")
    ours = {t.name: r for t, r in zip(spec.tensors, policies.resolve(policies.Policy(preset="mup"), spec))}
    checked = 0
    with torch.no_grad():
        for name, p in target.named_parameters():
            if p.dim() != 2 or name.endswith(("q_proj.weight", "lm_head.weight")):
                continue  # the readout and query are zeroed by µP's recommendation, not by mup.init
            mup.init.normal_(p, std=0.02)
            n = p.numel()
            tolerance = 6 * math.sqrt(1 / (2 * (n - 1)))
            assert p.std().item() == pytest.approx(ours[name].sampler.std, rel=tolerance), name
            checked += 1
    assert checked >= 10


@pytest.mark.parametrize("preset", ["olmo2", "gpt-neox", "deepnet", "mup", "xavier", "small-init", "hf-default"])
def test_measured_signal_through_a_linear_stack_follows_the_analytic_std(preset):
    """x_{l+1} = W_l x_l with x_0 ~ N(0, 1): std(x_L) = prod(effective_std_l · sqrt(fan_in_l)) (explain's
    numbers), within sampling tolerance, for the weights each preset gives a 4-layer stack."""
    import modelinit
    from modelinit_server.training.plain import plain_spec

    width, depth, batch = 256, 4, 4096
    stack = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(depth)])
    modelinit.init_module_(stack, seed=5, policy=preset)  # every preset here has a rule for a bare Linear stack
    from modelinit_server.training.modules import module_tensors

    named = module_tensors(stack)
    spec, _ = plain_spec(stack, [(n, t) for n, _, t in named], {n: r for n, r, _ in named})
    rs = policies.resolve(policies.Policy(preset=preset), spec)
    predicted = 1.0
    for r, t in zip(rs, spec.tensors):
        predicted *= r.effective_std * math.sqrt(t.fan_in)
    x = torch.from_numpy(__import__("numpy").random.default_rng(0).standard_normal((batch, width))).float()
    with torch.no_grad():
        measured = stack(x).double().std().item()
    # relative error per layer ~ 1/sqrt(2 fan_in) from the weights, plus the sample's; 4 layers
    assert measured == pytest.approx(predicted, rel=0.15), (preset, measured, predicted)
