"""The Hugging Face config a Megatron-Core ``GPTModel`` corresponds to, derived from its own
``TransformerConfig`` and ``GPTModel`` fields: what ``init_module_`` fills the model with when no
``spec`` is given (``MegatronStack.own_config``; reported as ``InitSummary.derived_config``).

Only where the mapping is exact, field for field:

* dense: ``llama`` (RMSNorm, a gated SiLU/GELU MLP; ``add_bias_linear`` is Llama's
  ``attention_bias`` and ``mlp_bias`` together), ``qwen2`` (q/k/v biases only: ``add_qkv_bias``),
  ``qwen3`` (``qk_layernorm``: RMSNorm over each head), ``starcoder2`` (LayerNorm, biases on
  every linear, a GELU MLP that is not gated);
* MoE (``num_moe_experts``, SequentialMLP or GroupedMLP experts): ``qwen3_moe`` (with
  ``qk_layernorm``; dense layers by ``moe_layer_freq`` as ``mlp_only_layers``), ``mixtral`` (every
  layer MoE, no q/k norms), ``qwen2_moe`` (a shared expert with its sigmoid gate,
  ``moe_shared_expert_gate``; q/k/v biases as ``add_qkv_bias`` says);
* multi-latent attention (``MLATransformerConfig``): ``deepseek_v3`` (``q_lora_rank``,
  ``kv_lora_rank``, ``qk_head_dim``/``qk_pos_emb_head_dim``/``v_head_dim`` as
  ``qk_nope_head_dim``/``qk_rope_head_dim``/``v_head_dim``, YaRN as ``rope_scaling``), dense or
  with DeepSeek's MoE;
* DeepSeek's MoE (sigmoid scores with the router's expert bias, ``moe_router_score_function`` and
  ``moe_router_enable_expert_bias``; shared experts without a gate; the first k layers dense):
  ``deepseek_v3`` with multi-latent attention, ``glm4_moe`` over grouped-query attention
  (``qk_layernorm`` as ``use_qk_norm``, ``add_qkv_bias`` as ``attention_bias``, ``rotary_percent``
  as ``partial_rotary_factor``); the group-limited top k and the weights' scale as ``n_group``,
  ``topk_group`` and ``routed_scaling_factor``;
* Llama 3.x's RoPE scaling (``GPTModel(rope_scaling=True)``), over grouped-query attention: as
  ``rope_scaling`` ``llama3``, its factor read off the frequencies the model holds
  (:func:`.rope.llama3_scaling`: GPTModel does not keep it).
* a ``HybridModel`` with Mamba layers: ``nemotron_h`` (:mod:`.nemotron`), its
  ``hybrid_override_pattern`` Megatron's pattern, its MoE layers routed as DeepSeek's MoE is; one of attention-then-MLP pairs: the GPTModel of
  the same layers (:mod:`.hybrid`).

Any other field that changes what the model computes or holds, and has no counterpart in the
family derived, is refused by name (:func:`hf_config` lists them), with the fix: give the
Hugging Face config the model corresponds to (``spec=...``).

The vocabulary derived is the model's own (``GPTModel.vocab_size``: Megatron's padded one, the
tokenizer's is not in the model). The fill is the same either way: a padded row holds the same
tensor's stream continued (megatron.layout), so the first rows are those of the folder of the
tokenizer's vocabulary, and the folder of the derived config holds every row. Only a policy whose
law reads the embedding's or output layer's ``fan_out`` (the vocabulary) tells them apart: then
give ``spec=`` with the tokenizer's vocabulary.

megatron is not imported here: the fields are read off the objects given.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from ..families import header
from .hybrid import Pattern, is_hybrid_model, pattern_of
from .rope import frequencies, llama3_scaling, refuse as _refuse, rotary_of

#: TransformerConfig fields that change the model and have no counterpart in any family derived,
#: with the value that means "off" and what they are.
_OFF: tuple[tuple[str, Any, str], ...] = (
    ("apply_residual_connection_post_layernorm", False, "the residual taken after the norm"),
    ("layernorm_zero_centered_gamma", False, "zero-centered norm weights (1 + w)"),
    ("rotary_interleaved", False, "interleaved RoPE"),
    ("multi_latent_attention", False, "multi-latent attention"),
    ("window_size", None, "sliding-window attention"),
    ("softmax_type", "vanilla", "a softmax with sinks"),
    ("qk_l2_norm", False, "L2-normalized queries and keys"),
    ("attention_output_gate", False, "a gated attention output"),
    ("no_rope_freq", None, "layers without RoPE"),
    ("experimental_attention_variant", None, "an attention variant (gated delta net, DSA)"),
    ("glu_linear_offset", 0.0, "an offset in the gated linear unit"),
    ("activation_func_clamp_value", None, "a clamped activation"),
    ("heterogeneous_block_specs", False, "heterogeneous layers"),
    ("mtp_num_layers", None, "multi-token prediction layers"),
    ("moe_latent_size", None, "MoE latent projections"),
    ("moe_apply_probs_on_input", False, "router probabilities applied to the experts' input"),
    ("moe_router_enable_expert_bias", False, "the router's expert bias"),
    ("moe_router_score_function", "softmax", "a router score function other than softmax without the expert bias "
     "(sigmoid with it is DeepSeek's MoE)"),
    ("moe_router_num_groups", None, "group-limited routing"),
    ("moe_router_topk_scaling_factor", None, "scaled routing weights"),
)

#: The router fields DeepSeek's MoE (DeepSeek-V3, GLM-4-MoE) has in its Hugging Face config: sigmoid
#: scores, the expert bias (``e_score_correction_bias``), group-limited top k, scaled weights.
_DEEPSEEK_ROUTER = ("moe_router_enable_expert_bias", "moe_router_score_function", "moe_router_num_groups",
                    "moe_router_topk_scaling_factor")


@dataclass(frozen=True)
class GPTFields:
    """What ``GPTModel`` keeps of its own arguments, beside its ``TransformerConfig``."""

    vocab_size: int
    max_sequence_length: int
    tied: bool = False
    position_embedding_type: str = "rope"
    rotary_percent: float = 1.0
    rotary_base: float = 10000
    rope_scaling: bool = False
    inv_freq: tuple[float, ...] = ()
    """The rotary frequencies ``rotary_pos_emb`` holds, read when ``rope_scaling`` is on: Llama 3.x's
    factor is not kept, but these are the unscaled ones scaled by it."""
    seq_len_interpolation_factor: float | None = None
    mtp: bool = False
    moe_layers: dict[int, bool] = field(default_factory=dict)
    """The layers the model holds (a pipeline stage: some): global index -> its MLP is MoE."""


def gpt_fields(model) -> GPTFields:
    """The fields of a ``GPTModel`` (any pipeline stage: each keeps the whole model's)."""
    rope = getattr(model, "rotary_pos_emb", None)
    layers = getattr(getattr(model, "decoder", None), "layers", ())
    return GPTFields(
        vocab_size=int(model.vocab_size), max_sequence_length=int(model.max_sequence_length),
        tied=bool(model.share_embeddings_and_output_weights),
        position_embedding_type=str(getattr(model, "position_embedding_type", "rope")),
        rotary_percent=float(getattr(model, "rotary_percent", 1.0)),
        rotary_base=getattr(model, "rotary_base", 10000), rope_scaling=bool(getattr(model, "rotary_scaling", False)),
        inv_freq=frequencies(rope) if getattr(model, "rotary_scaling", False) else (),
        seq_len_interpolation_factor=getattr(rope, "seq_len_interpolation_factor", None),
        mtp=bool(getattr(model, "mtp_process", False)),
        moe_layers={layer.layer_number - 1: type(layer.mlp).__name__ == "MoELayer" for layer in layers})


def own_config(model) -> dict[str, Any]:
    """The Hugging Face config ``model`` (a GPTModel, or a HybridModel of attention-then-MLP pairs:
    the GPTModel of the same layers, :class:`_PatternConfig`) corresponds to: :func:`hf_config` of its fields."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "num_attention_heads") or not hasattr(model, "vocab_size"):
        raise ValueError(f"spec: {type(model).__name__} is not a Megatron-Core GPTModel (no TransformerConfig, no "
                         "vocab_size), whose Hugging Face config modelinit derives; give the config it corresponds "
                         "to: init_module_(model, spec=...)")
    if is_hybrid_model(model):  # by pairs: one with Mamba layers is Nemotron-H's (.nemotron, asked first by the stack)
        return hf_config(_PatternConfig(config, pattern_of(model, by_symbol=False)), hybrid_fields(model))
    return hf_config(config, gpt_fields(model))


class _PatternConfig:
    """A HybridModel's ``TransformerConfig`` as the GPTModel of the same layers has it: its layers
    the Hugging Face ones (the pattern's ``*``: ``num_layers`` counts every symbol), its MoE layers
    those whose MLP is an ``E`` (``moe_layer_freq`` as one 0/1 per layer; the config's own does not
    apply to a HybridModel). Every other field is the config's."""

    def __init__(self, config, pattern: Pattern) -> None:
        self._config = config
        self.num_layers = pattern.layers
        self.moe_layer_freq = [int(m) for m in pattern.moe]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)


def hybrid_fields(model) -> GPTFields:
    """A ``HybridModel``'s fields as :class:`GPTFields`. It keeps neither ``rotary_base`` nor
    ``rotary_percent``: both are read off the frequencies its ``rotary_pos_emb`` holds
    (:func:`.rope.rotary_of`)."""
    rope = getattr(model, "rotary_pos_emb", None)
    base, percent = rotary_of(model.config, rope) if rope is not None else (10000.0, 1.0)
    return GPTFields(
        vocab_size=int(model.vocab_size), max_sequence_length=int(model.max_sequence_length),
        tied=bool(model.share_embeddings_and_output_weights),
        position_embedding_type=str(getattr(model, "position_embedding_type", "none")),
        rotary_percent=percent, rotary_base=base,
        seq_len_interpolation_factor=getattr(rope, "seq_len_interpolation_factor", None),
        mtp=bool(getattr(model, "mtp_process", False)))


def activation(config, squared_relu: bool = False) -> str:
    import torch.nn.functional as F

    func = config.activation_func
    for known, name in ((F.silu, "silu"), (F.gelu, "gelu")):
        if func is known:
            return name
    if squared_relu and getattr(func, "__name__", "") == "squared_relu" and \
            getattr(func, "__module__", "").startswith("megatron.core."):  # Megatron's activations.squared_relu
        return "relu2"
    raise _refuse("activation_func", getattr(func, "__name__", func), "an activation other than F.silu or F.gelu"
                  + (" or Megatron's squared_relu" if squared_relu else ""))


def _moe_pattern(config, gpt: GPTFields) -> list[bool]:
    """Per layer, whether its MLP is MoE: ``moe_layer_freq`` (an int k: every k-th layer from 0; a
    list: one 0/1 per layer), checked against the layers the model holds."""
    layers, freq = config.num_layers, getattr(config, "moe_layer_freq", 1)
    if isinstance(freq, int) and freq > 0:
        pattern = [i % freq == 0 for i in range(layers)]
    elif isinstance(freq, (list, tuple)) and len(freq) == layers:
        pattern = [bool(x) for x in freq]
    else:
        raise _refuse("moe_layer_freq", freq, f"not an int or a list of {layers} 0/1")
    for i, moe in gpt.moe_layers.items():
        if 0 <= i < layers and pattern[i] != moe:
            raise _refuse("moe_layer_freq", freq, f"layer {i} holds a{' MoE' if moe else ' dense'} MLP, which the "
                          "pattern does not say")
    return pattern


def check_off(config, mla: bool, routing: bool) -> None:
    """Refuse a field of :data:`_OFF` that is on (multi-latent attention and DeepSeek's routing
    where the family derived has them), and an embedding std apart from ``init_method_std``."""
    for name, off, what in _OFF:
        if (mla and name == "multi_latent_attention") or (routing and name in _DEEPSEEK_ROUTER):
            continue
        value = getattr(config, name, off)
        if value != off and not (off in (False, None) and not value):
            raise _refuse(name, value, what)
    embedding_std = getattr(config, "embedding_init_method_std", None)
    if embedding_std is not None and embedding_std != config.init_method_std:
        raise _refuse("embedding_init_method_std", embedding_std, "an embedding std apart from init_method_std: "
                      "Hugging Face has one initializer_range")


def hf_config(config, gpt: GPTFields) -> dict[str, Any]:
    """The Hugging Face config document of a GPTModel of ``config`` (its TransformerConfig) and
    ``gpt``; ``ValueError`` naming a field that has no counterpart in the family derived."""
    mla = bool(getattr(config, "multi_latent_attention", False))
    routing = deepseek_routing(config)
    check_off(config, mla, routing)
    glm4_moe = routing and not mla  # the one family derived with partial RoPE (partial_rotary_factor)
    if gpt.rotary_percent != 1.0 and not glm4_moe:
        raise _refuse("rotary_percent", gpt.rotary_percent, "partial RoPE")
    for name, value, off, what in (
            ("position_embedding_type", gpt.position_embedding_type, "rope", "positions other than RoPE"),
            ("seq_len_interpolation_factor", gpt.seq_len_interpolation_factor, None, "linearly interpolated RoPE"),
            ("mtp_block_spec", gpt.mtp, False, "multi-token prediction layers")):
        if value != off:
            raise _refuse(name, value, what)

    if mla:
        if gpt.rope_scaling:
            raise _refuse("rope_scaling", True, "Llama 3.x's RoPE scaling with multi-latent attention")
        return _mla(config, gpt)
    heads, layers = config.num_attention_heads, config.num_layers
    groups = config.num_query_groups or heads
    head_dim = config.kv_channels or config.hidden_size // heads
    doc: dict[str, Any] = {
        "hidden_size": config.hidden_size, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": groups, "head_dim": head_dim, "hidden_act": activation(config),
        "max_position_embeddings": gpt.max_sequence_length, "rope_theta": float(gpt.rotary_base),
        "vocab_size": gpt.vocab_size, "tie_word_embeddings": gpt.tied, "initializer_range": config.init_method_std,
        "attention_dropout": float(config.attention_dropout),
    }
    if gpt.rope_scaling:
        rotary = int(head_dim * gpt.rotary_percent) if gpt.rotary_percent < 1 else head_dim  # as RotaryEmbedding's dim
        doc["rope_scaling"] = llama3_scaling(gpt.rotary_base, gpt.inv_freq, rotary)
    shape = _Shape(config, gpt)
    if shape.norm == "RMSNorm":
        doc["rms_norm_eps"] = config.layernorm_epsilon
    family = _derive(shape)
    return {**header(family), **doc, **_FIELDS[family](config, gpt, shape)}


class _Shape:
    """What decides the family of a GPTModel without multi-latent attention, read off its config:
    the rules of :data:`_RULES` ask it. ``dense`` (the layers without experts) is read only when a
    rule asks (it refuses a ``moe_layer_freq`` the model's layers contradict)."""

    def __init__(self, config, gpt: GPTFields) -> None:
        self.config, self.gpt = config, gpt
        self.norm, self.gated = config.normalization, bool(config.gated_linear_unit)
        self.bias, self.qkv_bias = bool(config.add_bias_linear), bool(config.add_bias_linear or config.add_qkv_bias)
        self.qk_norm, self.experts = bool(config.qk_layernorm), config.num_moe_experts
        self.routing = deepseek_routing(config)
        self.shared = getattr(config, "moe_shared_expert_intermediate_size", None)
        self.gate = bool(getattr(config, "moe_shared_expert_gate", False))
        self.norm_topk = not bool(getattr(config, "moe_router_pre_softmax", False))  # softmax over the top k == renormalized

    @functools.cached_property
    def dense(self) -> list[int]:
        return [i for i, moe in enumerate(_moe_pattern(self.config, self.gpt)) if not moe]


#: The families a GPTModel without multi-latent attention is derived as, asked in order: a rule
#: whose ``when`` holds decides, and each of its requirements ``(field, value, holds, what)`` must
#: then hold, or the field is refused by name; ``None`` as a family: no family (the last holds).
#: Starcoder2 is the LayerNorm family; the RMSNorm ones have a gated MLP; dense Qwen3 has q/k norms,
#: Qwen2 q/k/v biases only; MoE: GLM-4-MoE routes as DeepSeek's MoE does, Qwen2-MoE has a gated
#: shared expert, Qwen3-MoE q/k norms, Mixtral neither (every layer MoE, its top k renormalized).
_LAYERNORM = ("with LayerNorm: Starcoder2 is the LayerNorm family derived (biases on every linear, an MLP that "
              "is not gated, no q/k norms, dense)")
_RULES: tuple[tuple[str | None, Any, tuple], ...] = (
    ("starcoder2", lambda s: s.norm == "LayerNorm", (
        ("gated_linear_unit", lambda s: s.gated, lambda s: not s.gated, _LAYERNORM),
        ("add_bias_linear", lambda s: s.bias, lambda s: s.bias, _LAYERNORM),
        ("qk_layernorm", lambda s: s.qk_norm, lambda s: not s.qk_norm, _LAYERNORM),
        ("num_moe_experts", lambda s: s.experts, lambda s: s.experts is None, _LAYERNORM))),
    (None, lambda s: s.norm != "RMSNorm", (
        ("normalization", lambda s: s.norm, lambda s: False, "a norm other than RMSNorm or LayerNorm"),)),
    (None, lambda s: not s.gated, (
        ("gated_linear_unit", lambda s: s.gated, lambda s: False, "an MLP that is not gated, with RMSNorm"),)),
    ("qwen3", lambda s: not s.experts and s.qk_norm, (
        ("add_bias_linear", lambda s: True, lambda s: not s.bias, "biases with q/k norms: Qwen3's attention_bias has "
         "no MLP bias and no q/k/v-only one"),
        ("add_qkv_bias", lambda s: True, lambda s: not s.qkv_bias, "biases with q/k norms: Qwen3's attention_bias has "
         "no MLP bias and no q/k/v-only one"))),
    ("qwen2", lambda s: not s.experts and s.qkv_bias and not s.bias, ()),
    ("llama", lambda s: not s.experts, ()),
    (None, lambda s: s.bias, (
        ("add_bias_linear", lambda s: True, lambda s: False, "biases on the experts' linears"),)),
    ("glm4_moe", lambda s: s.routing, ()),
    (None, lambda s: s.dense is None, ()),  # never holds: reads the MoE layers' pattern first, refusing a contradicted one
    ("qwen2_moe", lambda s: s.shared, (
        ("moe_shared_expert_gate", lambda s: False, lambda s: s.gate, "a shared expert without its gate under a "
         "softmax router: DeepSeek's and GLM-4's shared experts come with sigmoid scores and the expert bias"),
        ("qk_layernorm", lambda s: True, lambda s: not s.qk_norm, "q/k norms with a gated shared expert (Qwen2-MoE "
         "has none)"))),
    (None, lambda s: s.qkv_bias, (
        ("add_qkv_bias", lambda s: True, lambda s: False, "q/k/v biases in an MoE model without a shared expert"),)),
    ("qwen3_moe", lambda s: s.qk_norm, ()),
    ("mixtral", lambda s: True, (
        ("moe_layer_freq", lambda s: s.config.moe_layer_freq, lambda s: not s.dense, "dense layers in a Mixtral-style "
         "model (no q/k norms, every layer MoE)"),
        ("moe_router_pre_softmax", lambda s: True, lambda s: s.norm_topk, "Mixtral renormalizes its top k"))),
)


def _derive(shape: _Shape) -> str:
    """The family of :data:`_RULES` the model is, or the field that has no counterpart, refused."""
    for family, when, requires in _RULES:
        if not when(shape):
            continue
        for name, value, holds, what in requires:
            if not holds(shape):
                raise _refuse(name, value(shape), what)
        if family is not None:
            return family
    raise AssertionError("the last rule holds for every model")  # pragma: no cover - mixtral's when is True


def expert_width(config) -> int:
    return config.moe_ffn_hidden_size or config.ffn_hidden_size


#: Each family's fields beyond the ones every family has (``hf_config``'s ``doc``).
_FIELDS = {
    "starcoder2": lambda c, g, s: {"use_bias": True, "intermediate_size": c.ffn_hidden_size, "norm_epsilon": c.layernorm_epsilon},
    "qwen3": lambda c, g, s: {"intermediate_size": c.ffn_hidden_size, "attention_bias": False},
    "qwen2": lambda c, g, s: {"intermediate_size": c.ffn_hidden_size},
    "llama": lambda c, g, s: {"intermediate_size": c.ffn_hidden_size, "attention_bias": s.bias, "mlp_bias": s.bias},
    "glm4_moe": lambda c, g, s: {"intermediate_size": c.ffn_hidden_size, "attention_bias": s.qkv_bias, "use_qk_norm": s.qk_norm,
                                 "partial_rotary_factor": g.rotary_percent,
                                 **_deepseek_moe(c, g, "over grouped-query attention (GLM-4-MoE)")},
    "qwen2_moe": lambda c, g, s: {"intermediate_size": c.ffn_hidden_size, "moe_intermediate_size": expert_width(c),
                                  "shared_expert_intermediate_size": s.shared, "num_experts": c.num_moe_experts,
                                  "num_experts_per_tok": c.moe_router_topk, "norm_topk_prob": s.norm_topk,
                                  "decoder_sparse_step": 1, "mlp_only_layers": s.dense, "qkv_bias": s.qkv_bias},
    "qwen3_moe": lambda c, g, s: {"intermediate_size": c.ffn_hidden_size, "moe_intermediate_size": expert_width(c),
                                  "num_experts": c.num_moe_experts, "num_experts_per_tok": c.moe_router_topk,
                                  "norm_topk_prob": s.norm_topk, "decoder_sparse_step": 1, "mlp_only_layers": s.dense,
                                  "attention_bias": False},
    "mixtral": lambda c, g, s: {"intermediate_size": expert_width(c), "num_local_experts": c.num_moe_experts,
                                "num_experts_per_tok": c.moe_router_topk},
}


def _mla(config, gpt: GPTFields) -> dict[str, Any]:
    """DeepSeek-V3's config of a GPTModel with multi-latent attention (``MLATransformerConfig``):
    its q LoRA (``q_lora_rank``, None: ``q_proj``), KV latent, query/key dims without and with RoPE,
    value dims, YaRN as ``rope_scaling``; every layer dense (``first_k_dense_replace``), or
    DeepSeek's MoE (:func:`_deepseek_moe`)."""
    for name, value, want, what in (
            ("normalization", config.normalization, "RMSNorm", "DeepSeek-V3's norms are RMSNorm"),
            ("gated_linear_unit", bool(config.gated_linear_unit), True, "DeepSeek-V3's MLP is gated"),
            ("add_bias_linear", bool(config.add_bias_linear), False, "DeepSeek-V3's linears have no biases"),
            ("qk_layernorm", bool(config.qk_layernorm), True, "DeepSeek-V3 norms its q and KV latents")):
        if value != want:
            raise _refuse(name, value, f"with multi-latent attention: {what}")
    rope_type = getattr(config, "rope_type", "rope")
    if rope_type not in ("rope", "yarn"):
        raise _refuse("rope_type", rope_type, "RoPE other than rope or yarn")
    doc: dict[str, Any] = {
        **header("deepseek_v3"), "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_attention_heads, "intermediate_size": config.ffn_hidden_size,
        "q_lora_rank": config.q_lora_rank, "kv_lora_rank": config.kv_lora_rank, "qk_nope_head_dim": config.qk_head_dim,
        "qk_rope_head_dim": config.qk_pos_emb_head_dim, "v_head_dim": config.v_head_dim,
        "first_k_dense_replace": config.num_layers, "hidden_act": activation(config),
        "max_position_embeddings": gpt.max_sequence_length, "rope_theta": float(config.rotary_base),
        "vocab_size": gpt.vocab_size, "tie_word_embeddings": gpt.tied, "initializer_range": config.init_method_std,
        "attention_dropout": float(config.attention_dropout), "attention_bias": False,
        "rms_norm_eps": config.layernorm_epsilon}
    if rope_type == "yarn":
        doc["rope_scaling"] = {"type": "yarn", "factor": config.rotary_scaling_factor,
                               "original_max_position_embeddings": config.original_max_position_embeddings,
                               "beta_fast": config.beta_fast, "beta_slow": config.beta_slow, "mscale": config.mscale,
                               "mscale_all_dim": config.mscale_all_dim}
    if config.num_moe_experts:
        doc.update(_deepseek_moe(config, gpt, "with multi-latent attention (DeepSeek-V3)"))
    return doc


def deepseek_routing(config) -> bool:
    """Whether the model routes as DeepSeek's MoE does (sigmoid scores with the expert bias)."""
    return bool(config.num_moe_experts) and getattr(config, "moe_router_score_function", "softmax") == "sigmoid" \
        and bool(getattr(config, "moe_router_enable_expert_bias", False))


def sigmoid_router(config, family: str) -> dict[str, Any]:
    """The router fields of DeepSeek's MoE, as DeepSeek-V3, GLM-4-MoE and Nemotron-H have them:
    sigmoid scores with the expert bias, top k of at least 2 (Megatron renormalizes sigmoid top-k
    weights when k > 1: ``norm_topk_prob``), group-limited (``n_group``, ``topk_group``), scaled
    (``routed_scaling_factor``); no biases on the experts, no gate on a shared expert. ``family`` (as
    ``MoE DeepSeek-V3``) names what is not derived in a refusal."""
    if not deepseek_routing(config):
        raise _refuse("moe_router_score_function", getattr(config, "moe_router_score_function", "softmax"),
                      f"{family} routes by sigmoid scores with the expert bias (moe_router_score_function="
                      "'sigmoid', moe_router_enable_expert_bias=True)")
    if config.add_bias_linear:
        raise _refuse("add_bias_linear", True, "biases on the experts' linears")
    topk = config.moe_router_topk
    for name, value, bad, what in (
            ("moe_router_topk", topk, topk < 2, "one expert per token, whose sigmoid score Megatron keeps and "
             "norm_topk_prob makes 1"),
            ("moe_shared_expert_gate", True, bool(getattr(config, "moe_shared_expert_gate", False)),
             "a gated shared expert")):
        if bad:
            raise _refuse(name, value, f"{what}, with which {family} is not derived")
    return {"num_experts_per_tok": topk, "n_group": getattr(config, "moe_router_num_groups", None) or 1,
            "topk_group": getattr(config, "moe_router_group_topk", None) or 1,
            "routed_scaling_factor": float(getattr(config, "moe_router_topk_scaling_factor", None) or 1.0),
            "norm_topk_prob": True}


def _deepseek_moe(config, gpt: GPTFields, family: str) -> dict[str, Any]:
    """The MoE fields of DeepSeek-V3's and GLM-4-MoE's configs: routed experts after the first k
    dense layers (``first_k_dense_replace``), shared experts as wide as ``n_shared_experts`` routed
    ones without a gate, sigmoid scores with the expert bias, group-limited top k (``n_group``,
    ``topk_group``), weights renormalized (Megatron renormalizes sigmoid top-k weights when k > 1,
    ``norm_topk_prob``) and scaled (``routed_scaling_factor``)."""
    router = sigmoid_router(config, f"MoE {family}")
    width = config.moe_ffn_hidden_size or config.ffn_hidden_size
    shared = getattr(config, "moe_shared_expert_intermediate_size", None)
    if not shared or shared % width:
        raise _refuse("moe_shared_expert_intermediate_size", shared, f"shared experts whose width is not a multiple of "
                      f"the routed experts' ({width}), with which MoE {family} is not derived")
    pattern = _moe_pattern(config, gpt)
    first = pattern.index(True) if True in pattern else len(pattern)
    if not all(pattern[first:]):
        raise _refuse("moe_layer_freq", config.moe_layer_freq, "dense layers after the first MoE one: "
                      "first_k_dense_replace makes only the first k dense")
    return {"n_routed_experts": config.num_moe_experts, "moe_intermediate_size": width,
            "n_shared_experts": shared // width, "first_k_dense_replace": first, **router}
