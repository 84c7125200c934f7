"""The Hugging Face config a Megatron-Core ``HybridModel`` with Mamba layers corresponds to:
Nemotron-H's (``nemotron_h``, whose ``hybrid_override_pattern`` is Megatron's pattern, one layer per
symbol: :mod:`.hybrid`), derived from the model's ``TransformerConfig`` and its mixers where the mapping
is exact, and refused by field where it is not (:mod:`.config` says how, for the other models).

megatron is not imported here: the fields are read off the objects given."""
from __future__ import annotations

from typing import Any

from ..families import header
from .config import activation, check_off, deepseek_routing, expert_width, hybrid_fields, sigmoid_router
from .hybrid import MAMBA, MOE, pattern_of
from .rope import refuse as _refuse


def is_nemotron_h(model) -> bool:
    """Whether ``model`` is a HybridModel whose pattern has Mamba layers (its config is Nemotron-H's)."""
    return MAMBA in str(getattr(model, "hybrid_layer_pattern", "") or "").partition("/")[0]


def nemotron_h_config(model) -> dict[str, Any]:
    """Nemotron-H's config of a HybridModel of Mamba (``M``), attention (``*``), MLP (``-``) and MoE
    (``E``, :func:`_moe`) layers: ``hybrid_override_pattern`` is the pattern (transformers reads it as ``layers_block_type``); no
    position embedding; an MLP that is not gated (Megatron's ``squared_relu`` is ``relu2``); each
    Mamba-2 mixer's state size, heads, head dim and groups from the ``TransformerConfig``
    (``mamba_state_dim``, ``mamba_num_heads``, ``mamba_head_dim``, ``mamba_num_groups``), its
    convolution's width and gated norm read off the first mixer this rank holds (a stage without one:
    ``MambaMixer``'s defaults, ``d_conv=4``, ``expand=2``). ``dt_bias``'s range is not kept by the
    mixer: the config says Nemotron-H's defaults (0.001 to 0.1, floor 1e-4), which are also ``MambaMixer``'s."""
    config, pattern = model.config, pattern_of(model, by_symbol=True)
    moe = MOE in pattern.symbols
    check_off(config, mla=False, routing=moe and deepseek_routing(config))
    gpt = hybrid_fields(model)
    if gpt.position_embedding_type != "none":
        raise _refuse("position_embedding_type", gpt.position_embedding_type, "positions in a hybrid model with Mamba "
                      "layers: Nemotron-H has no position embedding (build it with position_embedding_type='none')")
    for name, value, want, what in (
            ("normalization", config.normalization, "RMSNorm", "Nemotron-H's norms are RMSNorm"),
            ("gated_linear_unit", bool(config.gated_linear_unit), False, "Nemotron-H's MLP is not gated"),
            ("qk_layernorm", bool(config.qk_layernorm), False, "Nemotron-H has no q/k norms"),
            ("add_qkv_bias", bool(config.add_qkv_bias and not config.add_bias_linear), False,
             "q/k/v biases alone: Nemotron-H's attention_bias is on the output projection too")):
        if value != want:
            raise _refuse(name, value, f"with Mamba layers: {what}")
    mixer = next((layer.mixer for layer in getattr(getattr(model, "decoder", None), "layers", ())
                  if type(getattr(layer, "mixer", None)).__name__ == "MambaMixer"), None)
    d_conv, expand = getattr(mixer, "d_conv", 4), getattr(mixer, "expand", 2)
    for name, value, want, what in (
            ("D_has_hdim", getattr(mixer, "D_has_hdim", False), False, "a D per channel: Nemotron-H has one per head"),
            ("rmsnorm", getattr(mixer, "rmsnorm", True), True, "a Mamba mixer without its gated norm"),
            ("norm_before_gate", getattr(mixer, "norm_before_gate", False), False,
             "the gated norm before the gate: Nemotron-H gates, then norms")):
        if value != want:
            raise _refuse(name, value, what)
    heads = getattr(mixer, "nheads", None) or config.mamba_num_heads or \
        int(expand * config.hidden_size) // config.mamba_head_dim
    attention_heads = config.num_attention_heads
    bias = bool(config.add_bias_linear)
    return {**header("nemotron_h"), **(_moe(config) if moe else {}), "hidden_size": config.hidden_size,
            "hybrid_override_pattern": pattern.symbols,
            "num_attention_heads": attention_heads, "num_key_value_heads": config.num_query_groups or attention_heads,
            "head_dim": config.kv_channels or config.hidden_size // attention_heads,
            "intermediate_size": config.ffn_hidden_size, "mlp_hidden_act": activation(config, squared_relu=True),
            "attention_bias": bias, "mlp_bias": bias, "max_position_embeddings": gpt.max_sequence_length,
            "vocab_size": gpt.vocab_size, "tie_word_embeddings": gpt.tied, "initializer_range": config.init_method_std,
            "layer_norm_epsilon": config.layernorm_epsilon, "attention_dropout": float(config.attention_dropout),
            "ssm_state_size": config.mamba_state_dim, "mamba_num_heads": heads, "mamba_head_dim": config.mamba_head_dim,
            "n_groups": config.mamba_num_groups, "conv_kernel": d_conv, "use_conv_bias": True, "use_bias": False,
            "mamba_proj_bias": False, "mamba_hidden_act": "silu", "time_step_min": 0.001, "time_step_max": 0.1,
            "time_step_floor": 1e-4}


def _moe(config) -> dict[str, Any]:
    """The MoE fields of Nemotron-H's config (its ``E`` layers): routed experts of
    ``moe_intermediate_size``, one shared expert of ``moe_shared_expert_intermediate_size`` (no gate),
    sigmoid scores with the expert bias (``e_score_correction_bias``), group-limited top k, the weights
    renormalized (Megatron renormalizes sigmoid top-k weights when k > 1) and scaled."""
    router = sigmoid_router(config, "Nemotron-H's MoE")
    shared = getattr(config, "moe_shared_expert_intermediate_size", None)
    if not shared:
        raise _refuse("moe_shared_expert_intermediate_size", shared, "no shared expert, with which Nemotron-H's MoE "
                      "(it has one) is not derived")
    return {"n_routed_experts": config.num_moe_experts, "moe_intermediate_size": expert_width(config),
            "moe_shared_expert_intermediate_size": shared, **router}
