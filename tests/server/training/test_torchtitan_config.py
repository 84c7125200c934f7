"""``init_module_`` on a torchtitan model without ``spec`` (issue 43): the Hugging Face config is
derived from the model's own configuration (``TorchtitanStack.own_config``,
training/torchtitan_config.py) and reported as ``summary.derived_config``.

The derivation is checked two ways: torchtitan's own Llama 3 8B and 70B flavors derive configs
whose specs are the real Llama-3-8B/70B's in every tensor (names, shapes, kinds, roles, fans; on
the meta device, nothing allocated), and tiny models of each family filled without a spec hold the
bytes of the folder of the equivalent explicit config (Llama 3: read back through torchtitan's
adapter; Qwen3 dense and MoE, DeepSeek-V3: equal to the fill with the explicit config, which
tests/server/training/test_torchtitan.py ties to the folder). A field with no Hugging Face
counterpart is refused by its torchtitan path, before anything is written.
"""
from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

import modelinit  # noqa: E402

from tests.support.torchtitan_models import (  # noqa: E402
    DEEPSEEK_V3, HF, QWEN3, QWEN3_MOE, SEED, flavor_model, folder_as_loaded, meta_model, titan_config)
from tests.support.distributed import same_bytes  # noqa: E402
from tests.support.stacks import install_torchtitan  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def torchtitan():
    return install_torchtitan()


def _tensors(spec) -> list[tuple]:
    """What decides each tensor's bytes and rule: name, shape, kind, role, param, layer, fans."""
    return [(t.name, t.shape, t.kind, t.role, t.param, t.layer, t.fan_in, t.fan_out) for t in spec.tensors]


def _own(model) -> dict:
    from modelinit_server.training.torchtitan_layout import STACK

    return STACK.own_config(model)


@pytest.mark.parametrize("flavor, preset", [("8B", "llama-3-8b"), ("70B", "llama-3-70b")])
def test_llama3_flavors_derive_the_real_llama3_configs(flavor, preset):
    """torchtitan's flavor (Llama 3.1's sizes: the FFN width from multiple_of and ffn_dim_multiplier,
    GQA, RoPE llama3 scaling) derives a config whose spec is the real checkpoint's, tensor by tensor."""
    from torchtitan.models.llama3 import model_registry

    from modelinit_server import architectures

    with torch.device("meta"):
        model = model_registry(flavor).model.build()
    derived = _own(model)
    real = architectures.from_preset(preset)
    assert _tensors(architectures.from_config(derived)) == _tensors(real)
    for field in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                  "vocab_size", "rms_norm_eps", "tie_word_embeddings"):
        assert derived[field] == real.config[field], field
    assert derived["rope_theta"] == 500000.0  # Llama 3.1's RoPE, as torchtitan builds it (the 8192-token Llama 3
    assert derived["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,  # preset has none)
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    assert derived["max_position_embeddings"] == 131072


def test_a_llama3_model_without_spec_holds_the_folders_bytes(tmp_path):
    """No spec: the derived config's folder, read back as torchtitan loads it, is the model's bytes,
    and the fingerprint is that of the explicit config's."""
    from modelinit_server import architectures

    model = meta_model().to_empty(device="cpu")
    summary = modelinit.init_module_(model, seed=SEED)
    derived = summary.derived_config
    assert _tensors(architectures.from_config(derived)) == _tensors(architectures.from_config(HF))
    ref = folder_as_loaded(tmp_path, "float32")
    got = dict(model.named_parameters())
    assert [n for n in ref if not same_bytes(got[n].detach(), ref[n])] == []
    explicit = modelinit.init_module_(meta_model().to_empty(device="cpu"), seed=SEED, spec=HF)
    assert summary.fingerprint == explicit.fingerprint and explicit.derived_config is None
    assert (summary.tensors, summary.elements, summary.missing) == (explicit.tensors, explicit.elements, 0)


def _sigmoid_routed(config):
    """DeepSeek-V3's debug flavor routes by softmax (transformers' DeepseekV3 by sigmoid): made sigmoid."""
    layers = [dataclasses.replace(layer, moe=dataclasses.replace(layer.moe, router=dataclasses.replace(
        layer.moe.router, score_func="sigmoid"))) if layer.moe is not None else layer for layer in config.layers]
    return dataclasses.replace(config, layers=layers)


@pytest.mark.parametrize("flavor, hf", [("debugmodel", QWEN3), ("debugmodel_moe", QWEN3_MOE), ("deepseek_v3", DEEPSEEK_V3)],
                         ids=["qwen3", "qwen3-moe", "deepseek-v3"])
def test_qwen3_and_deepseek_v3_without_spec_equal_their_explicit_configs(flavor, hf):
    from modelinit_server import architectures

    config = flavor_model(flavor, built=False)
    if flavor == "deepseek_v3":
        config = _sigmoid_routed(config)

    def fresh():
        with torch.device("meta"):
            return config.build().to_empty(device="cpu")

    model, explicit_model = fresh(), fresh()
    summary = modelinit.init_module_(model, seed=SEED)
    explicit = modelinit.init_module_(explicit_model, seed=SEED, spec=hf)
    assert _tensors(architectures.from_config(summary.derived_config)) == _tensors(architectures.from_config(hf))
    assert summary.derived_config["architectures"] == hf["architectures"]
    ref = dict(explicit_model.named_parameters(remove_duplicate=False))
    got = dict(model.named_parameters(remove_duplicate=False))
    assert sorted(got) == sorted(ref)
    assert [n for n in ref if not same_bytes(got[n].detach(), ref[n].detach())] == []
    assert summary.fingerprint == explicit.fingerprint
    assert summary.stack_buffers == explicit.stack_buffers


def _llama_with(**layer0):
    """The test's Llama 3 config with layer 0's sub-configs replaced (``attention_norm=...``)."""
    config = titan_config()
    layers = [dataclasses.replace(config.layers[0], **{k: f(config.layers[0]) for k, f in layer0.items()}),
              *config.layers[1:]]
    return dataclasses.replace(config, layers=layers)


REFUSED = {
    "an eps of its own": (
        lambda: _llama_with(attention_norm=lambda b: dataclasses.replace(b.attention_norm, eps=1e-6)),
        r"^module\.config\.layers\[0\]\.attention_norm\.eps: 1e-06 differs from norm\.eps's 1e-05, and a Hugging Face "
        r"config has one rms_norm_eps for the whole model; give the Hugging Face config this model corresponds to: "
        r"init_module_\(model, spec=\.\.\.\)$", HF),
    "a wider FFN in one layer": (
        lambda: _llama_with(feed_forward=lambda b: dataclasses.replace(
            b.feed_forward, w1=dataclasses.replace(b.feed_forward.w1, out_features=1024),
            w3=dataclasses.replace(b.feed_forward.w3, out_features=1024),
            w2=dataclasses.replace(b.feed_forward.w2, in_features=1024))),
        r"^module\.config\.layers\[1\]\.feed_forward\.w1\.out_features: 768 differs from "
        r"layers\[0\]\.feed_forward\.w1\.out_features's 1024, and a Hugging Face config has one intermediate_size for "
        r"the whole model; give", None),
    "q/k norms on Llama": (
        lambda: _llama_with(attention=lambda b: dataclasses.replace(b.attention, qk_norm=b.attention_norm)),
        r"^module\.config\.layers\[0\]\.attention\.qk_norm: set, and Llama has no q/k norms; give", None),
    "a softmax router on DeepSeek-V3": (
        lambda: flavor_model("deepseek_v3", built=False),
        r"^module\.config\.layers\[1\]\.moe\.router\.score_func: 'softmax', and the Hugging Face class routes by "
        r"sigmoid; give the Hugging Face config", DEEPSEEK_V3),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_field_without_a_hugging_face_counterpart_is_refused_by_name(case):
    """Refused before anything is written; where one Hugging Face config does correspond (the field
    decides no tensor: an eps, the routing), the fix the message names fills the model."""
    make, message, spec = REFUSED[case]
    with torch.device("meta"):
        model = make().build()
    model.to_empty(device="cpu")
    for p in model.parameters():
        p.detach().fill_(float("nan"))
    with pytest.raises(ValueError, match=message):
        modelinit.init_module_(model, seed=SEED)
    assert all(p.isnan().all() for p in model.parameters())  # refused before anything was written
    if spec is not None:
        modelinit.init_module_(model, seed=SEED, spec=spec)
        assert not any(p.isnan().any() for p in model.parameters())
