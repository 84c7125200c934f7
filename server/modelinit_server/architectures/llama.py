"""Llama, Mistral and Qwen2 (transformers ``modeling_llama.py`` / ``modeling_mistral.py`` /
``modeling_qwen2.py``): ``*ForCausalLM`` and the base ``*Model`` classes.

The three share one layout (pre-RMSNorm decoder blocks with grouped-query attention and a gated
MLP); they differ in config defaults and biases: Llama has ``attention_bias`` (q/k/v/o) and
``mlp_bias``, Mistral has no biases, Qwen2 always has q/k/v biases and nothing else.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..core.tensors import ModelSpec, TensorSpec
from ._family import Family
from ._fields import (
    divisible,
    fill,
    flag,
    init_range,
    invalid,
    layer_index,
    layers,
    mapping,
    optional,
    padding_row,
    positive_real,
    probability,
    size,
    string_list,
    text,
    token_id,
    token_ids,
)
from ._modules import assemble, embedding, linear, norm

#: Fields shared by the three config classes, with Llama's defaults.
_COMMON = {
    "vocab_size": (32000, size),
    "hidden_size": (4096, size),
    "intermediate_size": (11008, size),
    "num_hidden_layers": (32, layers),
    "num_attention_heads": (32, size),
    "hidden_act": ("silu", text),
    "max_position_embeddings": (2048, size),
    "initializer_range": (0.02, init_range),
    "rms_norm_eps": (1e-6, positive_real),
    "use_cache": (True, flag),
    "pad_token_id": (None, token_id),
    "bos_token_id": (1, token_id),
    "eos_token_id": (2, token_ids),
    "tie_word_embeddings": (False, flag),
    "rope_parameters": (None, mapping),
    "attention_dropout": (0.0, probability),
}

#: ``LlamaConfig`` fields and defaults (transformers 5.23).
LLAMA_SCHEMA = {
    **_COMMON,
    "num_key_value_heads": (None, optional(size)),
    "pretraining_tp": (1, optional(size)),
    "attention_bias": (False, flag),
    "attention_dropout": (0.0, optional(probability)),
    "mlp_bias": (False, flag),
    "head_dim": (None, optional(size)),
}

#: ``MistralConfig`` fields and defaults (``num_key_value_heads`` is a plain int there).
MISTRAL_SCHEMA = {
    **_COMMON,
    "intermediate_size": (14336, size),
    "num_key_value_heads": (8, size),
    "head_dim": (None, optional(size)),
    "max_position_embeddings": (4096 * 32, size),
    "sliding_window": (4096, optional(size)),
}

#: ``Qwen2Config`` fields and defaults (no ``head_dim`` field: a given one is kept as an extra key).
QWEN2_SCHEMA = {
    **_COMMON,
    "vocab_size": (151936, size),
    "intermediate_size": (22016, size),
    "num_key_value_heads": (32, optional(size)),
    "max_position_embeddings": (32768, size),
    "use_sliding_window": (False, flag),
    "sliding_window": (4096, optional(size)),
    "max_window_layers": (28, layer_index),
    "layer_types": (None, string_list),
    "bos_token_id": (None, token_id),
    "eos_token_id": (None, token_ids),
}

#: ``RotaryEmbeddingConfigMixin.default_theta``.
DEFAULT_ROPE_THETA = 10_000.0
#: RoPE types whose parameters carry the pre-training context length.
_SCALED_ROPE_TYPES = ("llama3", "yarn", "longrope")
#: Attention types the Qwen2 decoder layers implement.
_QWEN2_LAYER_TYPES = ("full_attention", "sliding_attention")


def _standardize_rope(cfg: dict[str, Any]) -> None:
    """Fold legacy ``rope_scaling`` / ``rope_theta`` / ``partial_rotary_factor`` into
    ``rope_parameters``, as transformers 5's ``RotaryEmbeddingConfigMixin`` does on load."""
    scaling = mapping("rope_scaling", cfg.pop("rope_scaling", None))
    source, params = ("rope_scaling", scaling) if scaling else ("rope_parameters", cfg["rope_parameters"] or {})
    if "rope_theta" in params:
        params["rope_theta"] = positive_real(f"{source}.rope_theta", params["rope_theta"])
    elif "rope_theta" in cfg:
        params["rope_theta"] = positive_real("rope_theta", cfg["rope_theta"])
    else:
        params["rope_theta"] = DEFAULT_ROPE_THETA
    cfg.pop("rope_theta", None)
    partial = cfg.pop("partial_rotary_factor", None)
    if partial is not None:
        params.setdefault("partial_rotary_factor", partial)
    params.setdefault("rope_type", params.get("type", "default"))
    if params["rope_type"] in _SCALED_ROPE_TYPES:
        params.setdefault("original_max_position_embeddings", cfg["max_position_embeddings"])
    cfg["rope_parameters"] = params


#: RoPE keys of transformers 4 configs; transformers 5 folds them into ``rope_parameters``.
_LEGACY_ROPE_KEYS = ("rope_scaling", "rope_theta", "partial_rotary_factor")


def _written_rope(document: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """The config to write: a config that states RoPE the transformers 4 way (``rope_scaling``,
    ``rope_theta``) keeps those keys as given, because transformers 4.57 reads only them and would
    silently drop scaling stated as ``rope_parameters``; transformers 5 folds them on load."""
    if not any(k in document for k in _LEGACY_ROPE_KEYS):
        return cfg
    written = {k: v for k, v in cfg.items() if k != "rope_parameters"}
    for k in _LEGACY_ROPE_KEYS:
        if k in document:
            written[k] = document[k]
    return written


def _complete_llama(cfg: dict[str, Any]) -> None:
    """``LlamaConfig.__post_init__`` (also ``MistralConfig``'s): derive head_dim and kv heads."""
    if cfg["head_dim"] is None:
        cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    if cfg["num_key_value_heads"] is None:
        cfg["num_key_value_heads"] = cfg["num_attention_heads"]


def _complete_qwen2(cfg: dict[str, Any]) -> None:
    """``Qwen2Config.__post_init__``: kv heads, the sliding window switch, per-layer attention types."""
    if "head_dim" in cfg:
        size("head_dim", cfg["head_dim"])
    if cfg["num_key_value_heads"] is None:
        cfg["num_key_value_heads"] = cfg["num_attention_heads"]
    if not cfg["use_sliding_window"]:
        cfg["sliding_window"] = None
    n = cfg["num_hidden_layers"]
    if cfg["layer_types"] is None:
        window = cfg["sliding_window"] is not None
        cfg["layer_types"] = [
            "sliding_attention" if window and i >= cfg["max_window_layers"] else "full_attention" for i in range(n)
        ]
    elif len(cfg["layer_types"]) != n or not set(cfg["layer_types"]) <= set(_QWEN2_LAYER_TYPES):
        raise invalid(
            "layer_types",
            f"needs one of {', '.join(_QWEN2_LAYER_TYPES)} per layer ({n}), got {cfg['layer_types']!r}",
            "list one attention type per layer or omit it",
        )


@dataclass(frozen=True)
class _Variant:
    """What differs between Llama, Mistral and Qwen2."""

    model_type: str
    schema: dict
    causal_lm: str
    base: str
    complete: Callable[[dict[str, Any]], None]
    """The config class's ``__post_init__`` derivations."""
    biases: Callable[[dict[str, Any]], tuple[bool, bool, bool]]
    """(q/k/v bias, o_proj bias, MLP bias) for a completed config."""
    heads_always_divide: bool
    """Llama validates ``hidden_size % num_attention_heads`` even when ``head_dim`` is given;
    Mistral and Qwen2 only need it to derive ``head_dim``."""


_LLAMA = _Variant(
    model_type="llama",
    schema=LLAMA_SCHEMA,
    causal_lm="LlamaForCausalLM",
    base="LlamaModel",
    complete=_complete_llama,
    biases=lambda cfg: (cfg["attention_bias"], cfg["attention_bias"], cfg["mlp_bias"]),
    heads_always_divide=True,
)
_MISTRAL = _Variant(
    model_type="mistral",
    schema=MISTRAL_SCHEMA,
    causal_lm="MistralForCausalLM",
    base="MistralModel",
    complete=_complete_llama,
    biases=lambda cfg: (False, False, False),
    heads_always_divide=False,
)
_QWEN2 = _Variant(
    model_type="qwen2",
    schema=QWEN2_SCHEMA,
    causal_lm="Qwen2ForCausalLM",
    base="Qwen2Model",
    complete=_complete_qwen2,
    biases=lambda cfg: (True, False, False),
    heads_always_divide=False,
)


def _check(variant: _Variant, cfg: dict[str, Any]) -> None:
    """Shape constraints the modeling code relies on."""
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    if variant.heads_always_divide or cfg.get("head_dim") is None:
        divisible("hidden_size", cfg["hidden_size"], "num_attention_heads", heads)
    # repeat_kv shares each kv head among num_attention_heads // num_key_value_heads query heads
    if kv is not None and heads % kv:
        raise invalid(
            "num_key_value_heads",
            f"{kv} does not divide num_attention_heads {heads}",
            "use a divisor of num_attention_heads (equal to it for plain multi-head attention)",
        )


def _decoder_layer(
    prefix: str, i: int, cfg: dict[str, Any], head_dim: int, biases: tuple[bool, bool, bool]
) -> list[TensorSpec]:
    """One ``*DecoderLayer``: attention, MLP, then the two RMSNorms (registration order)."""
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    q_out, kv_out = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    qkv_bias, o_bias, mlp_bias = biases
    p = f"{prefix}layers.{i}"
    return [
        *linear(f"{p}.self_attn.q_proj", h, q_out, "qkv", i, qkv_bias),
        *linear(f"{p}.self_attn.k_proj", h, kv_out, "qkv", i, qkv_bias),
        *linear(f"{p}.self_attn.v_proj", h, kv_out, "qkv", i, qkv_bias),
        *linear(f"{p}.self_attn.o_proj", q_out, h, "attn_out", i, o_bias),
        *linear(f"{p}.mlp.gate_proj", h, inter, "mlp_in", i, mlp_bias),
        *linear(f"{p}.mlp.up_proj", h, inter, "mlp_in", i, mlp_bias),
        *linear(f"{p}.mlp.down_proj", inter, h, "mlp_out", i, mlp_bias),
        *norm(f"{p}.input_layernorm", h, "attn_norm", i, bias=False),
        *norm(f"{p}.post_attention_layernorm", h, "mlp_norm", i, bias=False),
    ]


def _model(variant: _Variant, prefix: str, cfg: dict[str, Any]) -> list[TensorSpec]:
    """``*Model``: the token table (``padding_idx=pad_token_id``), the blocks, the final norm."""
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    head_dim = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    biases = variant.biases(cfg)
    pad = padding_row("pad_token_id", cfg["pad_token_id"], vocab, "embed_tokens")
    tensors = embedding(f"{prefix}embed_tokens", vocab, h, "token_embedding", pad)
    for i in range(cfg["num_hidden_layers"]):
        tensors += _decoder_layer(prefix, i, cfg, head_dim, biases)
    return tensors + norm(f"{prefix}norm", h, "final_norm", bias=False)


def _builder(variant: _Variant):
    def build(document: dict[str, Any], architecture: str) -> ModelSpec:
        cfg = fill(document, variant.schema)
        _check(variant, cfg)
        variant.complete(cfg)
        _standardize_rope(cfg)
        if architecture == variant.base:
            state_dict, tied = _model(variant, "", cfg), {}
        else:
            lm_head = linear("lm_head", cfg["hidden_size"], cfg["vocab_size"], "lm_head", bias=False)
            state_dict = _model(variant, "model.", cfg) + lm_head
            tied = {"lm_head.weight": "model.embed_tokens.weight"} if cfg["tie_word_embeddings"] else {}
        return assemble(
            family=variant.model_type,
            architecture=architecture,
            config=_written_rope(document, cfg),
            state_dict=state_dict,
            tied=tied,
            n_layers=cfg["num_hidden_layers"],
            hidden_size=cfg["hidden_size"],
            base_model_prefix="" if architecture == variant.base else "model",
        )

    return build


FAMILIES = tuple(
    Family(v.model_type, (v.causal_lm, v.base), _builder(v)) for v in (_LLAMA, _MISTRAL, _QWEN2)
)
