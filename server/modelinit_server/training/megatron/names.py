"""Megatron-Core's checkpoint keys as Hugging Face names: the tables (the rows of Megatron-Bridge's
Llama/Qwen mappings; multi-latent attention's as DeepSeek-V3 names them; each MoE family's), and
the layouts that are not one block: the grouped QKV (:func:`qkv_rows`), multi-latent attention's
fused tensors (:func:`mla_rows`, each one block), the gated MLP's [gate; up]. :func:`hf_boxes`
turns one of Megatron's per-layer tensors into the boxes of the Hugging Face tensors it holds."""
from __future__ import annotations

import re
import numpy as np

from ..families import MoeNames, moe_names
from ..fill import Box
from .hybrid import BY_SYMBOL

#: Megatron checkpoint key -> Hugging Face name (``{}``: the global layer index). The keys are those
#: of ``sharded_state_dict()``, which names the local spec's norms as Transformer Engine fuses them
#: (``input_layernorm`` as ``self_attention.linear_qkv.layer_norm_weight``).
_NAMES = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "decoder.final_layernorm.bias": "model.norm.bias",
    "decoder.final_norm.weight": "model.norm.weight",  # HybridModel's name for it
    "decoder.final_norm.bias": "model.norm.bias",
    # a layer spec without GPT's sharded_state_dict_keys_map (a HybridModel's local layers) keeps its norms' names
    "decoder.layers.input_layernorm.weight": "model.layers.{}.input_layernorm.weight",
    "decoder.layers.input_layernorm.bias": "model.layers.{}.input_layernorm.bias",
    "decoder.layers.pre_mlp_layernorm.weight": "model.layers.{}.post_attention_layernorm.weight",
    "decoder.layers.pre_mlp_layernorm.bias": "model.layers.{}.post_attention_layernorm.bias",
    "output_layer.weight": "lm_head.weight",
    "decoder.layers.self_attention.linear_qkv.layer_norm_weight": "model.layers.{}.input_layernorm.weight",
    "decoder.layers.self_attention.linear_qkv.layer_norm_bias": "model.layers.{}.input_layernorm.bias",
    "decoder.layers.self_attention.linear_proj.weight": "model.layers.{}.self_attn.o_proj.weight",
    "decoder.layers.self_attention.linear_proj.bias": "model.layers.{}.self_attn.o_proj.bias",
    "decoder.layers.self_attention.q_layernorm.weight": "model.layers.{}.self_attn.q_norm.weight",
    "decoder.layers.self_attention.k_layernorm.weight": "model.layers.{}.self_attn.k_norm.weight",
    "decoder.layers.mlp.linear_fc1.layer_norm_weight": "model.layers.{}.post_attention_layernorm.weight",
    "decoder.layers.mlp.linear_fc1.layer_norm_bias": "model.layers.{}.post_attention_layernorm.bias",
}
#: Multi-latent attention's keys (``multi_latent_attention``; DeepSeek-V3's names): Megatron's MLA
#: layer keeps its input norm under its own name, its q/kv latent norms as ``q_layernorm``/
#: ``kv_layernorm`` (local spec) or fused into ``linear_q_up_proj``/``linear_kv_up_proj`` as
#: ``layer_norm_weight`` (Transformer Engine spec). Every fused tensor holds the Hugging Face rows in
#: their order (:func:`mla_rows`: each head's no-RoPE then RoPE query rows, each head's key then value
#: rows, the KV latent then the shared RoPE key), so each maps as one block and a tensor-parallel
#: rank's rows (whole heads; the down projections' latent rows, column parallel in the local spec)
#: are a block of them.
_MLA_NAMES = {
    "decoder.layers.input_layernorm.weight": "model.layers.{}.input_layernorm.weight",
    "decoder.layers.pre_mlp_layernorm.weight": "model.layers.{}.post_attention_layernorm.weight",
    "decoder.layers.self_attention.linear_q_proj.weight": "model.layers.{}.self_attn.q_proj.weight",
    "decoder.layers.self_attention.linear_q_down_proj.weight": "model.layers.{}.self_attn.q_a_proj.weight",
    "decoder.layers.self_attention.q_layernorm.weight": "model.layers.{}.self_attn.q_a_layernorm.weight",
    "decoder.layers.self_attention.linear_q_up_proj.layer_norm_weight": "model.layers.{}.self_attn.q_a_layernorm.weight",
    "decoder.layers.self_attention.linear_q_up_proj.weight": "model.layers.{}.self_attn.q_b_proj.weight",
    "decoder.layers.self_attention.linear_kv_down_proj.weight": "model.layers.{}.self_attn.kv_a_proj_with_mqa.weight",
    "decoder.layers.self_attention.kv_layernorm.weight": "model.layers.{}.self_attn.kv_a_layernorm.weight",
    "decoder.layers.self_attention.linear_kv_up_proj.layer_norm_weight": "model.layers.{}.self_attn.kv_a_layernorm.weight",
    "decoder.layers.self_attention.linear_kv_up_proj.weight": "model.layers.{}.self_attn.kv_b_proj.weight",
}
#: Nemotron-H's names (``nemotron_h``: a HybridModel by symbol, :mod:`.hybrid`), ``{}`` the layer (the
#: pattern's symbol). Each layer has one norm, whatever its kind (a Mamba layer's ``norm``, an attention
#: layer's input norm, an MLP layer's pre-MLP norm; fused into the first linear by Transformer Engine),
#: and one mixer. A Mamba-2 mixer's tensors keep their names: ``in_proj`` and ``conv1d``, which Megatron
#: saves as parts (``in_proj.weight.z`` .. ``.dt``, ``conv1d.weight.x`` .. ``.C``), are read as the parts
#: put back together in their order (:func:`.reader.global_place`), which is the Hugging Face rows'
#: order ([z, x, B, C, dt] and [x, B, C]: ``NemotronHMamba2Mixer`` splits them so).
_NEMOTRON_H_LAYER = "backbone.layers.{}."
_NEMOTRON_H = {
    "embedding.word_embeddings.weight": "backbone.embeddings.weight",
    "decoder.final_norm.weight": "backbone.norm_f.weight",
    "output_layer.weight": "lm_head.weight",
    **{f"decoder.layers.{norm}": _NEMOTRON_H_LAYER + "norm.weight" for norm in (
        "norm.weight", "mixer.in_proj.layer_norm_weight", "input_layernorm.weight",
        "self_attention.linear_qkv.layer_norm_weight", "pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight")},
    **{f"decoder.layers.mixer.{t}": f"{_NEMOTRON_H_LAYER}mixer.{t}" for t in (
        "in_proj.weight", "conv1d.weight", "conv1d.bias", "dt_bias", "A_log", "D", "norm.weight", "out_proj.weight")},
    **{f"decoder.layers.{m}.{leaf}": f"{_NEMOTRON_H_LAYER}mixer.{hf}.{leaf}" for m, hf in (
        ("self_attention.linear_proj", "o_proj"), ("mlp.linear_fc1", "up_proj"), ("mlp.linear_fc2", "down_proj"),
        ("mlp.shared_experts.linear_fc1", "shared_experts.up_proj"),
        ("mlp.shared_experts.linear_fc2", "shared_experts.down_proj")) for leaf in ("weight", "bias")},
    "decoder.layers.mlp.router.weight": _NEMOTRON_H_LAYER + "mixer.gate.weight",
    "decoder.layers.mlp.router.expert_bias": _NEMOTRON_H_LAYER + "mixer.gate.e_score_correction_bias",
}
#: A routed expert's tensors (Megatron's second leading offset is the expert): Nemotron-H's, per expert.
_NEMOTRON_H_EXPERTS = {"decoder.layers.mlp.experts.experts.linear_fc1.weight": "up_proj.weight",
                       "decoder.layers.mlp.experts.experts.linear_fc2.weight": "down_proj.weight"}
#: The MLP's names, by the spec's naming: gated (SwiGLU: ``linear_fc1`` holds [gate; up]), or not.
_MLP = {True: ("gate_proj", "up_proj", "down_proj"), False: (None, "c_fc", "c_proj")}
_QKV = "decoder.layers.self_attention.linear_qkv."
PADDED = ("embedding.word_embeddings.weight", "output_layer.weight")
HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_LAYER_KEY = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


def qkv_rows(n_heads: int, n_groups: int, head_dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows of Megatron's fused ``linear_qkv`` (weight or bias) that hold the rows of the
    Hugging Face ``q_proj``, ``k_proj`` and ``v_proj``, in their order.

    Megatron groups the rows per query group (``SelfAttention.get_query_key_value_tensors`` views
    them as ``[groups, (heads/groups + 2) * head_dim]`` and splits each group into its queries,
    then its key, then its value): group ``g`` holds query heads ``g*h .. (g+1)*h - 1`` (``h =
    heads/groups``), then key head ``g``, then value head ``g``. A tensor-parallel rank holds
    whole groups."""
    if n_groups <= 0 or n_heads % n_groups:
        raise ValueError(f"module: {n_heads} attention heads do not divide into {n_groups} query groups")
    per = n_heads // n_groups
    block = (per + 2) * head_dim
    g = np.arange(n_groups, dtype=np.int64)[:, None] * block
    d = np.arange(head_dim, dtype=np.int64)[None, :]
    q = (g[:, None, :] + np.arange(per, dtype=np.int64)[None, :, None] * head_dim + d[:, None, :]).reshape(-1)
    k = (g + per * head_dim + d).reshape(-1)
    v = (g + (per + 1) * head_dim + d).reshape(-1)
    return q, k, v


def mla_rows(n_heads: int, nope: int, rope: int, v_dim: int, kv_lora_rank: int) -> dict[str, np.ndarray]:
    """For multi-latent attention: the rows of the Hugging Face tensor that Megatron's fused tensor
    holds, in Megatron's row order, by what its forward (``MLASelfAttention.get_query_key_value_tensors``)
    splits them into. ``linear_q_up_proj``/``linear_q_proj`` ([heads, nope + rope] rows: each head's
    query without RoPE, then its RoPE part) is ``q_b_proj``/``q_proj``; ``linear_kv_up_proj``
    ([heads, nope + v]: each head's key without RoPE, then its value) is ``kv_b_proj``;
    ``linear_kv_down_proj`` ([kv_lora_rank + rope]: the KV latent, then the key's RoPE part shared by
    every head) is ``kv_a_proj_with_mqa``. DeepSeek-V3's Hugging Face forward splits the same rows
    the same way (the RoPE rows as interleaved pairs in both: Megatron's MLA RoPE de-interleaves them
    as DeepSeek's ``rope_interleave`` does), so each is the identity: every fused tensor is one block."""
    for name, value in (("num_attention_heads", n_heads), ("qk_head_dim", nope), ("qk_pos_emb_head_dim", rope),
                        ("v_head_dim", v_dim), ("kv_lora_rank", kv_lora_rank)):
        if value <= 0:
            raise ValueError(f"module: multi-latent attention's {name} is {value}; it must be positive")
    return {"linear_q_up_proj": np.arange(n_heads * (nope + rope), dtype=np.int64),
            "linear_kv_up_proj": np.arange(n_heads * (nope + v_dim), dtype=np.int64),
            "linear_kv_down_proj": np.arange(kv_lora_rank + rope, dtype=np.int64)}


def whole_box(shape: tuple[int, ...]) -> Box:
    return (0,) * len(shape), tuple(range(len(shape))), (0,) * len(shape), tuple(shape)


def hf_boxes(key: str, lead: tuple[int, ...], shape: tuple[int, ...], config, gated: bool,
              family: str = "") -> list[tuple[str, Box]]:
    """The Hugging Face tensors (name, box of them in Megatron's per-layer tensor ``key`` of ``shape``)
    the tensor holds (``lead``: its leading offsets, layer then expert); their shapes are checked
    against the spec by the caller."""
    layer = lead[0] if lead else None

    def hf(name: str) -> str:
        return name.format(layer) if "{}" in name else name

    if family == BY_SYMBOL:
        return _nemotron_h_boxes(key, lead, shape, config, hf)
    if getattr(config, "multi_latent_attention", False) and key in _MLA_NAMES:  # one block each: mla_rows
        return [(hf(_MLA_NAMES[key]), whole_box(shape))]
    if key in _NAMES:
        return [(hf(_NAMES[key]), whole_box(shape))]
    leaf = key.rpartition(".")[2]
    if key.startswith(_QKV) and leaf in ("weight", "bias"):
        return _qkv_boxes(key, shape, config, f"model.layers.{layer}.self_attn.", leaf)
    names = moe_names(family)
    mlp = _mlp_prefix(key, lead, names)
    if mlp is None:
        raise ValueError(f"module: Megatron's {key!r} has no Hugging Face counterpart modelinit knows; GPTModel with the "
                         "local or Transformer Engine layer spec (GQA, a SwiGLU or GELU MLP, MoE experts) is supported")
    prefix, rest = mlp
    gate, up, down = names.expert_mlp if prefix.startswith(names.experts.partition("{")[0]) and gated else _MLP[gated]
    layer_prefix = f"model.layers.{layer}.{prefix}"
    if prefix == "mlp." and rest == "router.weight":
        return [(f"model.layers.{layer}.{names.router}", whole_box(shape))]
    if prefix == "mlp." and rest == "router.expert_bias":
        return [(f"model.layers.{layer}.{names.expert_bias}", whole_box(shape))]
    if prefix == names.shared and rest == "gate_weight" and names.shared_gate:
        return [(f"model.layers.{layer}.{names.shared_gate}", whole_box(shape))]
    fc, _, leaf = rest.partition(".")
    if fc == "linear_fc1" and leaf in ("weight", "bias"):
        if not gated:
            return [(f"{layer_prefix}{up}.{leaf}", whole_box(shape))]
        half = shape[0] // 2
        zeros = (0,) * (len(shape) - 1)
        dims = tuple(range(len(shape)))
        return [(f"{layer_prefix}{gate}.{leaf}", ((0, *zeros), dims, (0,) * len(shape), (half, *shape[1:]))),
                (f"{layer_prefix}{up}.{leaf}", ((half, *zeros), dims, (0,) * len(shape), (half, *shape[1:])))]
    if fc == "linear_fc2" and leaf in ("weight", "bias"):
        return [(f"{layer_prefix}{down}.{leaf}", whole_box(shape))]
    raise ValueError(f"module: Megatron's {key!r} has no Hugging Face counterpart modelinit knows; GPTModel with the "
                     "local or Transformer Engine layer spec (GQA, a SwiGLU or GELU MLP, MoE experts) is supported")


def _nemotron_h_boxes(key: str, lead: tuple[int, ...], shape: tuple[int, ...], config,
                      hf) -> list[tuple[str, Box]]:
    """:func:`hf_boxes` for a Nemotron-H spec: the table, a routed expert's tensors, and the grouped QKV as
    the mixer's q/k/v."""
    layer = lead[0] if lead else None
    if key in _NEMOTRON_H:
        return [(hf(_NEMOTRON_H[key]), whole_box(shape))]
    if key in _NEMOTRON_H_EXPERTS:
        if len(lead) != 2:
            raise ValueError(f"module: Megatron saves {key!r} without its expert's index; this layout is not supported")
        return [(f"{_NEMOTRON_H_LAYER.format(layer)}mixer.experts.{lead[1]}.{_NEMOTRON_H_EXPERTS[key]}",
                 whole_box(shape))]
    leaf = key.rpartition(".")[2]
    if key.startswith(_QKV) and leaf in ("weight", "bias"):
        return _qkv_boxes(key, shape, config, f"{_NEMOTRON_H_LAYER.format(layer)}mixer.", leaf)
    raise ValueError(f"module: Megatron's {key!r} has no Nemotron-H counterpart modelinit knows; a HybridModel of "
                     "Mamba, attention, MLP and MoE layers (local modules, SequentialMLP experts) is supported")


def _qkv_boxes(key: str, shape: tuple[int, ...], config, prefix: str, leaf: str) -> list[tuple[str, Box]]:
    """The boxes of ``q_proj``, ``k_proj`` and ``v_proj`` (under ``prefix``) in the grouped QKV."""
    head_dim = config.kv_channels or config.hidden_size // config.num_attention_heads
    groups = config.num_query_groups or config.num_attention_heads
    out = []
    for proj, idx in zip("qkv", qkv_rows(config.num_attention_heads, groups, head_dim)):
        if int(idx.max()) >= shape[0]:
            raise ValueError(f"module: Megatron's {key!r} has {shape[0]} rows, fewer than {config.num_attention_heads} "
                             f"heads in {groups} groups of {head_dim} need")
        consecutive = np.array_equal(idx, np.arange(idx[0], idx[0] + idx.size))
        start = (int(idx[0]) if consecutive else idx, *([0] * (len(shape) - 1)))
        box = (start, tuple(range(len(shape))), (0,) * len(shape), (idx.size, *shape[1:]))
        out.append((f"{prefix}{proj}_proj.{leaf}", box))
    return out


def _mlp_prefix(key: str, lead: tuple[int, ...], names: "MoeNames") -> tuple[str, str] | None:
    """The Hugging Face prefix (after ``model.layers.N.``) of an MLP key's tensors, and the rest of
    the key: the dense MLP, a routed expert (the expert's global index is Megatron's second
    leading offset), the shared experts, the router."""
    if key.startswith("decoder.layers.mlp.experts.experts."):
        if len(lead) != 2:
            raise ValueError(f"module: Megatron saves {key!r} without its expert's index; this layout is not supported")
        return names.experts.format(lead[1]), key.removeprefix("decoder.layers.mlp.experts.experts.")
    if key.startswith("decoder.layers.mlp.shared_experts."):
        return names.shared, key.removeprefix("decoder.layers.mlp.shared_experts.")
    if key.startswith("decoder.layers.mlp."):
        return "mlp.", key.removeprefix("decoder.layers.mlp.")
    return None


def stacked(key: str, lead: tuple[int, ...]) -> tuple[str, tuple[int, ...]]:
    """A layer's key as the stacked layers' key: Megatron saves the layers of a model whose layers
    differ (``moe_layer_freq`` a list or above 1: dense and MoE layers) one key each,
    ``decoder.layers.<global layer>.<rest>``, instead of stacking them on a leading axis; the same
    tensor is then ``decoder.layers.<rest>`` at that layer."""
    m = _LAYER_KEY.match(key)
    return (f"decoder.layers.{m.group(2)}", (int(m.group(1)), *lead)) if m else (key, lead)
