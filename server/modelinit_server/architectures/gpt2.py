"""GPT-2 (transformers ``modeling_gpt2.py``): ``GPT2LMHeadModel`` and ``GPT2Model``.

GPT-2 projections are ``Conv1D`` modules: linear layers whose weight is stored ``[in, out]``.
"""
from __future__ import annotations

from typing import Any

from ..core.tensors import ModelSpec, TensorSpec
from ._family import Family
from ._fields import (
    divisible,
    fill,
    flag,
    init_range,
    layers,
    optional,
    positive_real,
    probability,
    reject_true,
    size,
    text,
    token_id,
    token_ids,
)
from ._modules import assemble, conv1d, embedding, linear, norm

#: ``GPT2Config`` fields and defaults (transformers 5.23).
GPT2_SCHEMA = {
    "vocab_size": (50257, size),
    "n_positions": (1024, size),
    "n_embd": (768, size),
    "n_layer": (12, layers),
    "n_head": (12, size),
    "n_inner": (None, optional(size)),
    "activation_function": ("gelu_new", text),
    "resid_pdrop": (0.1, probability),
    "embd_pdrop": (0.1, probability),
    "attn_pdrop": (0.1, probability),
    "layer_norm_epsilon": (1e-5, positive_real),
    "initializer_range": (0.02, init_range),
    "summary_type": ("cls_index", text),
    "summary_use_proj": (True, flag),
    "summary_activation": (None, optional(text)),
    "summary_proj_to_labels": (True, flag),
    "summary_first_dropout": (0.1, probability),
    "scale_attn_weights": (True, flag),
    "use_cache": (True, flag),
    "bos_token_id": (50256, token_id),
    "eos_token_id": (50256, token_ids),
    "pad_token_id": (None, token_id),
    "scale_attn_by_inverse_layer_idx": (False, flag),
    "reorder_and_upcast_attn": (False, flag),
    "add_cross_attention": (False, flag),
    "tie_word_embeddings": (True, flag),
}

#: ``GPT2Config.attribute_map``: generic names that set the GPT-2 fields (and win over them).
ALIASES = {
    "hidden_size": "n_embd",
    "max_position_embeddings": "n_positions",
    "num_attention_heads": "n_head",
    "num_hidden_layers": "n_layer",
}

LM_HEAD, BASE = "GPT2LMHeadModel", "GPT2Model"


def _resolve_aliases(document: dict[str, Any]) -> dict[str, Any]:
    """Store generic names under GPT-2's own, as ``GPT2Config`` does."""
    resolved = dict(document)
    for alias, field in ALIASES.items():
        if alias in resolved:
            resolved[field] = resolved.pop(alias)
    return resolved


def _block(prefix: str, i: int, h: int, inner: int) -> list[TensorSpec]:
    """One pre-norm ``GPT2Block``."""
    p = f"{prefix}h.{i}"
    return [
        *norm(f"{p}.ln_1", h, "attn_norm", i),
        *conv1d(f"{p}.attn.c_attn", h, 3 * h, "qkv", i),
        *conv1d(f"{p}.attn.c_proj", h, h, "attn_out", i),
        *norm(f"{p}.ln_2", h, "mlp_norm", i),
        *conv1d(f"{p}.mlp.c_fc", h, inner, "mlp_in", i),
        *conv1d(f"{p}.mlp.c_proj", inner, h, "mlp_out", i),
    ]


def _transformer(prefix: str, cfg: dict[str, Any]) -> list[TensorSpec]:
    """``GPT2Model``: token and position tables (no padding row), the blocks, the final norm."""
    h = cfg["n_embd"]
    # GPT2Block: `n_inner if n_inner is not None else 4 * hidden_size`
    inner = cfg["n_inner"] if cfg["n_inner"] is not None else 4 * h
    tensors = [
        *embedding(f"{prefix}wte", cfg["vocab_size"], h, "token_embedding"),
        *embedding(f"{prefix}wpe", cfg["n_positions"], h, "position_embedding"),
    ]
    for i in range(cfg["n_layer"]):
        tensors += _block(prefix, i, h, inner)
    return tensors + norm(f"{prefix}ln_f", h, "final_norm")


def build(document: dict[str, Any], architecture: str) -> ModelSpec:
    """Check and complete a GPT-2 config and enumerate ``architecture``'s tensors."""
    cfg = fill(_resolve_aliases(document), GPT2_SCHEMA)
    divisible("n_embd", cfg["n_embd"], "n_head", cfg["n_head"])
    reject_true(cfg, "add_cross_attention", "cross-attention (encoder-decoder) layers are not supported")
    if architecture == BASE:
        state_dict, tied = _transformer("", cfg), {}
    else:
        lm_head = linear("lm_head", cfg["n_embd"], cfg["vocab_size"], "lm_head", bias=False)
        state_dict = _transformer("transformer.", cfg) + lm_head
        tied = {"lm_head.weight": "transformer.wte.weight"} if cfg["tie_word_embeddings"] else {}
    return assemble(
        family="gpt2",
        architecture=architecture,
        config=cfg,
        state_dict=state_dict,
        tied=tied,
        n_layers=cfg["n_layer"],
        hidden_size=cfg["n_embd"],
        base_model_prefix="" if architecture == BASE else "transformer",
    )


FAMILIES = (Family("gpt2", (LM_HEAD, BASE), build),)
