"""``init_module_`` on a Megatron-Core ``GPTModel`` without ``spec`` (issue 43): the Hugging Face
config is derived from the model's own ``TransformerConfig`` and ``GPTModel`` fields
(``training/megatron/config.py``) where the mapping is exact, and refused by field where it is not.

The derivation is checked on config objects (no model: a Llama-3-8B-shaped ``TransformerConfig``
derives the real Llama-3-8B's tensors, every one), the fill on tiny models in one spawned process:
a model filled without a spec has the bytes of the same model filled with the explicit config,
and of the Hugging Face folder of the derived config."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core", reason="megatron-core is in the test extra")

import modelinit  # noqa: E402
from modelinit_server.architectures import PRESETS, from_config, from_preset  # noqa: E402
from modelinit_server.training.megatron.config import GPTFields, hf_config  # noqa: E402

from tests.support.distributed import no_collectives, same_bytes  # noqa: E402
from tests.support.megatron_models import (HF, MOE, MOE_FIELDS, PADDED, SEED, STARCODER2,  # noqa: E402
                                           STARCODER2_FIELDS, files_of, in_one_process, megatron_gpt)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # Megatron warns that Apex/TE are absent
F = torch.nn.functional

#: The test models' TransformerConfig (tests/support/megatron_models.megatron_gpt): Qwen3-shaped.
_SMALL = dict(num_layers=4, hidden_size=64, num_attention_heads=8, num_query_groups=2, kv_channels=8, ffn_hidden_size=96,
              gated_linear_unit=True, activation_func=F.silu, normalization="RMSNorm", add_bias_linear=False,
              qk_layernorm=True, layernorm_epsilon=1e-6)
_GPT = GPTFields(vocab_size=PADDED, max_sequence_length=128, rotary_base=HF.get("rope_theta", 10000))


def _config(**fields):
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(**{**_SMALL, **fields})


def test_a_llama_3_8b_shaped_config_derives_the_real_llama_3_8b():
    """Megatron's Llama-3-8B (as Megatron-Bridge configures it: 32 layers, 4096 wide, 32 heads in 8
    groups, SwiGLU 14336, RMSNorm 1e-5, RoPE base 500000, 8192 positions, vocabulary 128256, no
    biases, untied) derives the hub's config: every tensor (name, shape, kind, role, layer, fans)
    equal to the ``llama-3-8b`` preset's, and every field of the preset that shapes the model or
    its init the same."""
    config = _config(num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8, kv_channels=None,
                     ffn_hidden_size=14336, qk_layernorm=False, layernorm_epsilon=1e-5, attention_dropout=0.0,
                     hidden_dropout=0.0)
    derived = hf_config(config, GPTFields(vocab_size=128256, max_sequence_length=8192, rotary_base=500000))
    assert from_config(derived).tensors == from_preset("llama-3-8b").tensors
    hub = PRESETS["llama-3-8b"]
    fields = ("architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "vocab_size", "tie_word_embeddings", "attention_bias", "mlp_bias", "hidden_act",
              "rms_norm_eps", "rope_theta", "max_position_embeddings", "initializer_range", "attention_dropout")
    assert {f: derived[f] for f in fields} == {f: hub[f] for f in fields}
    assert set(derived) - set(hub) == {"head_dim"} and derived["head_dim"] == 4096 // 32  # Llama's own default


def _mla_config(**fields):
    from megatron.core.transformer import MLATransformerConfig

    return MLATransformerConfig(**{**_SMALL, "num_query_groups": None, "kv_channels": None, "qk_layernorm": True,
                                   **fields})


def test_a_deepseek_v3_shaped_mla_config_derives_deepseek_v3s_dense_layers():
    """Megatron's DeepSeek-V3 attention (MLATransformerConfig: 128 heads, q LoRA 1536, KV latent
    512, 128 + 64 query/key dims, 128 value dims, YaRN factor 40), its first three (dense) layers
    alone, derives the hub's config cut to those layers: every tensor equal, the MLA sizes and YaRN
    as the hub has them."""
    hub = PRESETS["deepseek-v3"]
    config = _mla_config(num_layers=3, hidden_size=7168, num_attention_heads=128, ffn_hidden_size=18432,
                         q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128,
                         rope_type="yarn", rotary_scaling_factor=40, original_max_position_embeddings=4096,
                         mscale=1.0, mscale_all_dim=1.0, layernorm_epsilon=1e-6, attention_dropout=0.0)
    derived = hf_config(config, GPTFields(vocab_size=129280, max_sequence_length=163840))
    assert from_config(derived).tensors == from_config({**hub, "num_hidden_layers": 3}).tensors
    fields = ("architectures", "model_type", "hidden_size", "intermediate_size", "num_attention_heads",
              "num_key_value_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
              "first_k_dense_replace", "vocab_size", "tie_word_embeddings", "attention_bias", "hidden_act", "rms_norm_eps",
              "rope_theta", "rope_scaling", "max_position_embeddings", "initializer_range", "attention_dropout")
    assert {f: derived[f] for f in fields} == {f: hub[f] for f in fields}
    assert hf_config(_mla_config(q_lora_rank=None, rope_type="rope", num_attention_heads=4), _GPT)["q_lora_rank"] is None
    for fields, message in (({"qk_layernorm": False}, r"qk_layernorm=False \(with multi-latent attention"),
                            ({**MOE_FIELDS}, r"moe_router_score_function='softmax' \(MoE with multi-latent attention "
                                              r"\(DeepSeek-V3\) routes by sigmoid scores with the expert bias")):
        with pytest.raises(ValueError, match=rf"^spec: the Megatron model's {message}.*init_module_\(model, spec="):
            hf_config(_mla_config(rope_type="rope", num_attention_heads=4, **fields), _GPT)


@pytest.mark.slow
def test_deepseek_v3_whole_derives_the_real_deepseek_v3():
    """Megatron's DeepSeek-V3 (as Megatron-Bridge configures it: MLA as above, 61 layers of which
    the first three dense, 256 routed experts 2048 wide, top 8 in 4 of 8 groups, sigmoid scores
    with the expert bias, weights scaled by 2.5, one shared expert 2048 wide) derives the hub's
    config: every tensor equal to the ``deepseek-v3`` preset's, and every MoE field the same."""
    hub = PRESETS["deepseek-v3"]
    config = _mla_config(num_layers=61, hidden_size=7168, num_attention_heads=128, ffn_hidden_size=18432,
                         q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128,
                         rope_type="yarn", rotary_scaling_factor=40, original_max_position_embeddings=4096,
                         mscale=1.0, mscale_all_dim=1.0, layernorm_epsilon=1e-6, attention_dropout=0.0,
                         num_moe_experts=256, moe_ffn_hidden_size=2048, moe_router_topk=8,
                         moe_layer_freq=[0] * 3 + [1] * 58, moe_shared_expert_intermediate_size=2048,
                         moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
                         moe_router_num_groups=8, moe_router_group_topk=4, moe_router_topk_scaling_factor=2.5)
    derived = hf_config(config, GPTFields(vocab_size=129280, max_sequence_length=163840))
    assert from_config(derived).tensors == from_preset("deepseek-v3").tensors
    fields = ("n_routed_experts", "moe_intermediate_size", "n_shared_experts", "num_experts_per_tok",
              "first_k_dense_replace", "n_group", "topk_group", "routed_scaling_factor", "norm_topk_prob",
              "num_hidden_layers", "intermediate_size")
    assert {f: derived[f] for f in fields} == {f: hub[f] for f in fields}


#: GLM-4-MoE-style Megatron fields: DeepSeek's MoE (sigmoid scores, the expert bias, a shared expert
#: without a gate) over the test model's grouped-query attention with q/k norms.
_GLM4_FIELDS = dict(MOE_FIELDS, moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
                    moe_shared_expert_intermediate_size=32)
_GLM4 = {**HF, "model_type": "glm4_moe", "architectures": ["Glm4MoeForCausalLM"], "moe_intermediate_size": 32,
         "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 0,
         "use_qk_norm": True, "attention_bias": False}


@pytest.mark.parametrize("fields, hf", [
    ({}, HF),
    (MOE_FIELDS, MOE),
    ({**STARCODER2_FIELDS, "activation_func": F.gelu}, {**STARCODER2, "initializer_range": 0.02}),  # Megatron's std
    ({"qk_layernorm": False}, {**HF, "model_type": "llama", "architectures": ["LlamaForCausalLM"]}),
    ({"qk_layernorm": False, "add_qkv_bias": True}, {**HF, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}),
    ({"qk_layernorm": False, "add_bias_linear": True}, {**HF, "model_type": "llama", "architectures": ["LlamaForCausalLM"],
                                                        "attention_bias": True, "mlp_bias": True}),
    ({**MOE_FIELDS, "qk_layernorm": False}, {**HF, "model_type": "mixtral", "architectures": ["MixtralForCausalLM"],
                                              "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32}),
    ({**MOE_FIELDS, "qk_layernorm": False, "add_qkv_bias": True, "moe_shared_expert_intermediate_size": 48,
      "moe_shared_expert_gate": True},
     {**MOE, "model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], "shared_expert_intermediate_size": 48,
      "qkv_bias": True}),
    ({**MOE_FIELDS, "moe_layer_freq": [0, 1, 1, 0]}, {**MOE, "mlp_only_layers": [0, 3]}),
    (_GLM4_FIELDS, _GLM4),
    ({**_GLM4_FIELDS, "qk_layernorm": False, "add_qkv_bias": True, "moe_layer_freq": [0, 1, 1, 1]},
     {**_GLM4, "use_qk_norm": False, "attention_bias": True, "first_k_dense_replace": 1}),
], ids=["qwen3", "qwen3-moe", "starcoder2", "llama", "qwen2", "llama-biases", "mixtral", "qwen2-moe-shared-expert",
        "qwen3-moe-dense-layers", "glm4-moe", "glm4-moe-biases-dense-first"])
def test_each_family_derived_has_the_tensors_of_its_hugging_face_config(fields, hf):
    """The families derived, each from the Megatron fields of the Hugging Face config it
    corresponds to: the derived config's spec has exactly that config's tensors (the padded
    vocabulary's rows included: the derived vocabulary is the model's)."""
    derived = hf_config(_config(**fields), _GPT)
    assert derived["model_type"] == hf["model_type"]
    assert from_config(derived).tensors == from_config({**hf, "vocab_size": PADDED}).tensors


#: An MLA config with plain RoPE (its own YaRN aside), for the refusal of Llama 3.x scaling with it.
_MLA_ROPE = {"mla": {"rope_type": "rope", "num_attention_heads": 4}}


@pytest.mark.parametrize("fields, gpt, message", [
    ({"window_size": (64, 0)}, {}, r"window_size=\(64, 0\) \(sliding-window attention\)"),
    ({"moe_router_score_function": "sigmoid", **MOE_FIELDS}, {}, r"moe_router_score_function='sigmoid' \(a router "
     r"score function other than softmax without the expert bias"),
    ({**_GLM4_FIELDS, "moe_shared_expert_gate": True}, {}, r"moe_shared_expert_gate=True \(a gated shared expert, "
     r"with which MoE over grouped-query attention \(GLM-4-MoE\) is not derived"),
    ({**_GLM4_FIELDS, "moe_shared_expert_intermediate_size": None}, {}, r"moe_shared_expert_intermediate_size=None"),
    ({**_GLM4_FIELDS, "moe_shared_expert_intermediate_size": 48}, {}, r"moe_shared_expert_intermediate_size=48 "
     r"\(shared experts whose width is not a multiple of the routed experts' \(32\)"),
    ({**_GLM4_FIELDS, "moe_router_topk": 1}, {}, r"moe_router_topk=1 \(one expert per token"),
    ({**_GLM4_FIELDS, "moe_layer_freq": [1, 0, 1, 1]}, {}, r"moe_layer_freq=\[1, 0, 1, 1\] \(dense layers after the "
     r"first MoE one"),
    ({"activation_func": F.relu}, {}, r"activation_func='relu'"),
    ({"layernorm_zero_centered_gamma": True}, {}, r"layernorm_zero_centered_gamma=True"),
    ({"add_bias_linear": True}, {}, r"add_bias_linear=True \(biases with q/k norms"),
    ({"normalization": "LayerNorm"}, {}, r"gated_linear_unit=True \(with LayerNorm"),
    ({"embedding_init_method_std": 0.01}, {}, r"embedding_init_method_std=0\.01"),
    ({**MOE_FIELDS, "moe_shared_expert_intermediate_size": 48}, {}, r"moe_shared_expert_gate=False"),
    ({**MOE_FIELDS, "qk_layernorm": False, "moe_layer_freq": 2}, {}, r"moe_layer_freq=2 \(dense layers in a Mixtral"),
    (MOE_FIELDS, {"moe_layers": {1: False}}, r"moe_layer_freq=1 \(not .*|moe_layer_freq=1 \(layer 1 holds a dense MLP"),
    ({}, {"position_embedding_type": "learned_absolute"}, r"position_embedding_type='learned_absolute'"),
    ({}, {"rope_scaling": True}, r"rope_scaling=True \(Llama 3\.x's RoPE scaling, whose factor GPTModel does not keep; "
     r"its rotary_pos_emb\.inv_freq, where the factor is read from, has 0 frequencies \(on the meta device: none\), "
     r"not 4\)"),
    ({}, {"rope_scaling": True, "inv_freq": (1.0, 0.1, 0.01, 0.0004)}, r"rope_scaling=True \(.*; rotary_pos_emb\.inv_freq "
     r"is not the unscaled frequencies scaled as Llama 3\.x scales them \(the nearest factor, 3\.008, does not "
     r"give them\)"),
    ({"kv_channels": 4}, {"rope_scaling": True, "rotary_base": 10.0, "inv_freq": (1.0, 0.316)}, r"rope_scaling=True "
     r"\(.*; every rotary wavelength is under 2048, which Llama 3\.x's scaling keeps, so the factor cannot be read\)"),
    (_MLA_ROPE, {"rope_scaling": True}, r"rope_scaling=True \(Llama 3\.x's RoPE scaling with multi-latent attention\)"),
    ({}, {"rotary_percent": 0.5}, r"rotary_percent=0\.5 \(partial RoPE\)"),
    ({}, {"mtp": True}, r"mtp_block_spec=True"),
])
def test_a_field_without_a_hugging_face_counterpart_is_refused_by_name(fields, gpt, message):
    """Each field the families derived cannot say is refused in one line: ``spec:``, the field and
    its value, what it is, and the fix (give the config: ``spec=...``)."""
    config = _mla_config(**fields["mla"]) if "mla" in fields else _config(**fields)
    with pytest.raises(ValueError, match=rf"^spec: the Megatron model's {message}.*give the Hugging Face config this "
                                         r"model corresponds to: init_module_\(model, spec="):
        hf_config(config, GPTFields(**{**_GPT.__dict__, **gpt}))


def _rotary(kv_channels: int, base: float, factor: float, percent: float = 1.0) -> tuple[float, ...]:
    """The frequencies Megatron's own RotaryEmbedding holds with Llama 3.x's scaling by ``factor``."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    rope = RotaryEmbedding(kv_channels, percent, rotary_base=base, rope_scaling=True, rope_scaling_factor=factor,
                           use_cpu_initialization=True)
    return tuple(rope.inv_freq.tolist())


def _hf_frequencies(derived: dict) -> torch.Tensor:
    """The rotary frequencies transformers computes for the derived config (its own rope init)."""
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = AutoConfig.for_model(derived["model_type"], **{k: v for k, v in derived.items() if k != "model_type"})
    return ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")[0]


def test_megatrons_llama_3_1_rope_scaling_derives_the_hubs():
    """Megatron's Llama-3.1-8B (as above, with ``rope_scaling=True``, whose factor 8 GPTModel does
    not keep) derives the hub's ``rope_scaling`` exactly: the factor is read off the frequencies
    ``rotary_pos_emb`` holds, and transformers' rotary frequencies of the derived config are
    Megatron's."""
    config = _config(num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8, kv_channels=None,
                     ffn_hidden_size=14336, qk_layernorm=False, layernorm_epsilon=1e-5, attention_dropout=0.0)
    held = _rotary(128, 500000, 8.0)
    derived = hf_config(config, GPTFields(vocab_size=128256, max_sequence_length=131072, rotary_base=500000,
                                          rope_scaling=True, inv_freq=held))
    hub = PRESETS["llama-3.1-8b"]
    assert derived["rope_scaling"] == hub["rope_scaling"]
    assert from_config(derived).tensors == from_preset("llama-3.1-8b").tensors
    torch.testing.assert_close(_hf_frequencies(derived), torch.tensor(held), rtol=1e-6, atol=0)


@pytest.mark.parametrize("kv_channels, base, factor, percent", [
    (64, 500000, 32.0, 1.0),  # Llama 3.2 1B's: the lowest frequencies divided by the factor
    (8, 10000, 32.0, 1.0),  # every wavelength under 8192: the factor is read in the smoothed band
    (16, 10000, 2.5, 1.0),
    (16, 10000, 8.0, 0.5),  # partial RoPE (GLM-4-MoE's): the frequencies of the rotary part
])
def test_the_rope_scaling_factor_is_read_off_the_frequencies(kv_channels, base, factor, percent):
    """Llama 3.x scaling by any factor, over any rotary size and base, derives that factor, and
    transformers' frequencies for the derived config are Megatron's (relative 1e-6)."""
    fields = {**_GLM4_FIELDS} if percent < 1 else {}
    config = _config(kv_channels=kv_channels, num_attention_heads=8, hidden_size=8 * kv_channels, **fields)
    held = _rotary(kv_channels, base, factor, percent)
    derived = hf_config(config, GPTFields(vocab_size=PADDED, max_sequence_length=128, rotary_base=base,
                                          rotary_percent=percent, rope_scaling=True, inv_freq=held))
    assert derived["rope_scaling"] == {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    torch.testing.assert_close(_hf_frequencies(derived), torch.tensor(held), rtol=1e-6, atol=0)


def _check_derived(out: str) -> None:
    """Qwen3 (dense) and Mixtral-style (MoE, no q/k norms) tiny models filled without a spec: the
    same bytes as with the explicit config (and, for Qwen3, as with the tokenizer's vocabulary:
    the padded rows are the stream continued); Mixtral's experts and router are the folder's."""
    for fields, explicit in (({}, (HF, {**HF, "vocab_size": PADDED})),
                             ({"moe": True, "qk_layernorm": False}, ())):
        derived_model = megatron_gpt(dtype="bfloat16", **fields)
        with no_collectives():
            summary = modelinit.init_module_(derived_model, seed=SEED)
        assert summary.derived_config == hf_config(derived_model.config, GPTFields(
            vocab_size=PADDED, max_sequence_length=128, rotary_base=derived_model.rotary_base))
        assert summary.missing == 0 and summary.elements == sum(p.numel() for p in derived_model.parameters())
        got = {n: p.detach() for n, p in derived_model.named_parameters()}
        for spec in (*explicit, summary.derived_config):
            model = megatron_gpt(dtype="bfloat16", **fields)
            again = modelinit.init_module_(model, seed=SEED, spec=spec)
            assert again.fingerprint == summary.fingerprint or spec is HF  # the tokenizer's vocabulary: another plan
            assert [n for n, p in model.named_parameters() if not same_bytes(p.detach(), got[n])] == [], spec
        torch.save({"derived": summary.derived_config, "state": got}, f"{out}-{summary.derived_config['model_type']}.pt")
    # Llama 3.x's RoPE scaling: the factor read off the model's frequencies; the weights are the unscaled model's
    # (the last one above, Mixtral-style)
    scaled = megatron_gpt(dtype="bfloat16", moe=True, qk_layernorm=False, rope_scaling=True, rope_scaling_factor=32.0)
    with no_collectives():
        again = modelinit.init_module_(scaled, seed=SEED)
    assert again.derived_config == {**summary.derived_config, "rope_scaling": {
        "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}}
    assert [n for n, p in scaled.named_parameters() if not same_bytes(p.detach(), got[n])] == []
    # dense and MoE layers (moe_layer_freq a list; Megatron's decoder block spec): Megatron saves one key per layer
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    config = megatron_gpt(dtype="bfloat16", moe=True, moe_layer_freq=[0, 1, 1, 0]).config
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm", qk_l2_norm=False)
    mixed = GPTModel(config, spec, vocab_size=PADDED, max_sequence_length=128, position_embedding_type="rope")
    with no_collectives():
        summary = modelinit.init_module_(mixed, seed=SEED)
    assert summary.derived_config["mlp_only_layers"] == [0, 3] and summary.missing == 0
    state = {n: p.detach() for n, p in mixed.named_parameters()}
    assert summary.elements == sum(p.numel() for p in state.values())
    torch.save({"derived": summary.derived_config, "state": state}, f"{out}-mixed.pt")


@pytest.mark.slow
def test_a_model_filled_without_a_spec_is_the_folder_of_its_derived_config(tmp_path):
    """Without ``spec=``: the config derived is reported (``summary.derived_config``), the fill is
    the explicit config's, and the Hugging Face folder of the derived config (``modelinit init``)
    holds the same bytes: Mixtral's per-expert ``w1``/``w3`` as Megatron's ``[gate; up]``, ``w2`` as
    ``linear_fc2``, ``block_sparse_moe.gate`` as the router, the padded vocabulary's rows. A
    Qwen3-MoE-style model with dense layers (``moe_layer_freq=[0, 1, 1, 0]``, built by Megatron's
    decoder block spec, which saves each layer under its own key) derives ``mlp_only_layers: [0,
    3]`` and holds its folder's bytes."""
    out = str(tmp_path / "filled")
    in_one_process(str(tmp_path / "pg"), _check_derived, out)
    mixtral = torch.load(f"{out}-mixtral.pt")
    assert torch.load(f"{out}-qwen3.pt")["derived"]["vocab_size"] == PADDED
    with modelinit.Client() as c:
        c.init_model(mixtral["derived"], seed=SEED, out_dir=tmp_path / "hf", dtype="bfloat16")
    files, state = files_of(tmp_path / "hf"), mixtral["state"]
    assert same_bytes(state["embedding.word_embeddings.weight"], files["model.embed_tokens.weight"])
    assert same_bytes(state["output_layer.weight"], files["lm_head.weight"])
    for i in range(4):
        hf, mine = f"model.layers.{i}.block_sparse_moe.", f"decoder.layers.{i}.mlp."
        assert same_bytes(state[mine + "router.weight"], files[hf + "gate.weight"])
        for e in range(4):
            expert = f"{mine}experts.local_experts.{e}."
            w1, w3, w2 = (files[f"{hf}experts.{e}.{w}.weight"] for w in ("w1", "w3", "w2"))
            assert same_bytes(state[expert + "linear_fc1.weight"], torch.cat([w1, w3]))
            assert same_bytes(state[expert + "linear_fc2.weight"], w2)
    mixed = torch.load(f"{out}-mixed.pt")  # Qwen3-MoE with mlp_only_layers [0, 3]: the folder of its derived config
    with modelinit.Client() as c:
        c.init_model(mixed["derived"], seed=SEED, out_dir=tmp_path / "hf-mixed", dtype="bfloat16")
    files, state = files_of(tmp_path / "hf-mixed"), mixed["state"]
    for i in (0, 3):  # dense
        assert same_bytes(state[f"decoder.layers.{i}.mlp.linear_fc1.weight"], torch.cat(
            [files[f"model.layers.{i}.mlp.gate_proj.weight"], files[f"model.layers.{i}.mlp.up_proj.weight"]]))
    for i in (1, 2):  # MoE
        assert same_bytes(state[f"decoder.layers.{i}.mlp.router.weight"], files[f"model.layers.{i}.mlp.gate.weight"])
        assert same_bytes(state[f"decoder.layers.{i}.mlp.experts.local_experts.3.linear_fc2.weight"],
                          files[f"model.layers.{i}.mlp.experts.3.down_proj.weight"])
    for i in range(4):
        assert same_bytes(state[f"decoder.layers.{i}.self_attention.linear_proj.weight"],
                          files[f"model.layers.{i}.self_attn.o_proj.weight"])


@pytest.mark.parametrize("pattern, message", [
    ("*-M+", r"layer 3 is '\+', a multi-latent attention layer.*modelinit maps Mamba \('M'\), attention \('\*'\), "
             r"MLP \('-'\) and MoE \('E'\) layers one per Nemotron-H layer"),
    ("*-*G", r"layer 3 is 'G', a gated delta net layer"),
    ("+-+-", r"layer 0 is '\+', a multi-latent attention layer"),
    ("**--", r"layer 1 is '\*' where an MLP \('-' or 'E'\) goes.*attention then MLP"),
    ("*-*", r"last layer \(2, '\*'\) has no MLP after it"),
    ("*-*E/*-", r"hybrid_layer_pattern '\*-\*E/\*-' has multi-token prediction layers \('/\*-'\)"),
    ("", r"hybrid_layer_pattern is ''"),
], ids=["mla-beside-mamba", "gated-delta-net", "mla", "two-attentions", "no-last-mlp", "mtp", "empty"])
def test_a_hybrid_pattern_without_a_hugging_face_counterpart_is_refused_by_name(pattern, message):
    """A HybridModel's layers map to Hugging Face layers by position, attention then MLP (or, with Mamba
    layers, one Nemotron-H layer per symbol): a symbol with no counterpart (gated delta net, MLA, DSA), a
    pattern that does not pair, MTP layers: each refused in one line naming the layer, before anything is
    written (the parameters untouched)."""
    import torch

    model = type("HybridModel", (torch.nn.Module,), {"__module__": "megatron.core.models.hybrid.hybrid_model"})()
    model.hybrid_layer_pattern = pattern
    model.weight = torch.nn.Parameter(torch.full((2, 2), 7.0))
    with pytest.raises(ValueError, match=rf"^module: the HybridModel's {message}"):
        modelinit.init_module_(model, seed=SEED)
    assert torch.equal(model.weight, torch.full((2, 2), 7.0))


def test_a_hybrid_pattern_pairs_its_layers_by_position():
    """Symbol k of ``*-*E|*-*E`` (stages joined) is Hugging Face layer k // 2; the MoE layers are the ``E`` ones."""
    from modelinit_server.training.megatron.hybrid import parse

    pattern = parse("*-*E|*-*E")
    assert pattern.symbols == "*-*E*-*E" and pattern.hf_layers == (0, 0, 1, 1, 2, 2, 3, 3)
    assert pattern.layers == 4 and pattern.moe == [False, True, False, True]


def test_an_old_mamba_model_is_refused_by_name():
    """Megatron-Core before 0.17 has a MambaModel that is no HybridModel: refused in one line, untouched."""
    import torch

    model = type("MambaModel", (torch.nn.Module,), {"__module__": "megatron.core.models.mamba.mamba_model"})()
    model.weight = torch.nn.Parameter(torch.full((2, 2), 7.0))
    with pytest.raises(ValueError, match=r"^module: this Megatron-Core's MambaModel .* is not supported; Megatron-Core "
                                         r"0.19's HybridModel of attention, MLP and MoE layers is"):
        modelinit.init_module_(model, seed=SEED)
    assert torch.equal(model.weight, torch.full((2, 2), 7.0))
