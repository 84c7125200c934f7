"""Module kind, role, layer and fans of any stored tensor, from module types and names.

The kind comes from the in-memory module that owns the tensor (its torch type or, for the
per-family classes, its class name); the role from the name on disk, read as a path
(``model.layers.3.self_attn.o_proj.weight``: inside a block, in attention, the output
projection). docs/policies.md ("Kinds and roles") lists the mapping. The built-in families'
hand-written specs give the same answers (tests/server/architectures/test_generic.py checks it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

#: Path components that hold the numbered blocks; the number after one is the layer index.
BLOCK_CONTAINERS = frozenset({"layers", "layer", "h", "block", "blocks"})

_TOKEN_TABLES = {"word_embeddings", "embed_tokens", "wte", "shared", "embed_in", "tok_embeddings", "word_embedding"}
_POSITION_TABLES = {"position_embeddings", "wpe", "embed_positions", "relative_attention_bias", "position_embedding"}
_QK_NORMS = {"q_norm", "k_norm", "q_layernorm", "k_layernorm", "query_layernorm", "key_layernorm", "q_a_layernorm", "kv_a_layernorm"}
_ATTN_NORMS = {"input_layernorm", "ln_1", "attention_norm", "self_attn_layer_norm", "encoder_attn_layer_norm",
               "layernorm_before", "ln_attn", "attn_norm", "pre_attention_layernorm"}
_MLP_NORMS = {"post_attention_layernorm", "ln_2", "pre_feedforward_layernorm", "post_feedforward_layernorm",
              "final_layer_norm", "layernorm_after", "ln_mlp", "ffn_norm", "post_layernorm"}
_EMBEDDING_NORMS = {"layernorm_embedding", "emb_layer_norm", "word_embeddings_layernorm", "embedding_norm", "emb_ln"}
_ATTN_OUT = {"o_proj", "out_proj", "o", "c_proj", "dense", "wo", "proj", "out", "output"}
_MLP_OUT = {"down_proj", "c_proj", "fc2", "w2", "wo", "dense_4h_to_h", "proj_out"}
_LM_HEADS = {"lm_head", "embed_out", "decoder", "output"}
_CLASSIFIERS = {"classifier", "score", "qa_outputs", "seq_relationship"}
_ROUTER_NAMES = {"gate", "router", "shared_expert_gate", "gating"}


@dataclass(frozen=True)
class ModuleInfo:
    """What the in-memory model says about one stored tensor's source."""

    sources: tuple[str, ...]
    """In-memory state_dict names the stored tensor comes from (one, or several concatenated)."""
    kind: str
    fan_in: int
    fan_out: int
    padding_idx: int | None
    parent_class: str
    """Class name of the module holding the owning module (T5's ``T5LayerFF``...)."""
    lm_bias: bool = False
    """A bare output bias of an LM head (BERT ``cls.predictions.bias``)."""

    @classmethod
    def of(cls, model, name: str) -> "ModuleInfo":
        import torch.nn as nn

        path, _, attr = name.rpartition(".")
        module = model.get_submodule(path) if path else model
        parent_path = path.rpartition(".")[0]
        parent = model.get_submodule(parent_path) if path and parent_path else model
        tensor = getattr(module, attr)
        cname = type(module).__name__
        shape = tuple(tensor.shape)
        parts = path.split(".")
        padding = None
        lm_bias = False
        if isinstance(module, nn.Embedding):
            kind, fan_in, fan_out = "embedding", module.embedding_dim, module.num_embeddings
            if module.padding_idx is not None:
                padding = module.padding_idx % module.num_embeddings
        elif isinstance(module, nn.Linear) or cname == "Conv1D":
            if isinstance(module, nn.Linear):
                fan_in, fan_out = module.in_features, module.out_features
            else:
                fan_in, fan_out = module.nx, module.nf
            kind = "linear"
            if _in_experts(parts):
                kind = "expert"
            elif parts[-1] in _ROUTER_NAMES and _is_moe(parent):
                kind = "router"
        elif isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)):
            kind, (fan_in, fan_out) = "conv", _torch_fans(module.weight.shape)
        elif isinstance(module, (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm)) or "Norm" in cname:
            kind, fan_in, fan_out = "norm", math.prod(shape), math.prod(shape)
        elif len(shape) == 3 and ("Expert" in cname or (parts and parts[-1] == "experts")):
            kind, fan_in, fan_out = "expert", shape[-1], shape[-2]
        elif "Router" in cname or "Gate" in cname or (parts and parts[-1] in _ROUTER_NAMES and _is_moe(parent)):
            kind = "router"
            fan_in, fan_out = (shape[-1], shape[-2]) if len(shape) >= 2 else (0, 0)
        elif attr.endswith("bias") and isinstance(getattr(module, "decoder", None), nn.Linear):
            kind, lm_bias = "linear", True
            fan_in, fan_out = module.decoder.in_features, module.decoder.out_features
        else:
            kind = "other"
            fan_in, fan_out = _torch_fans(shape) if len(shape) >= 2 else (0, 0)
        return cls((name,), kind, int(fan_in), int(fan_out), padding, type(parent).__name__, lm_bias)

    def for_output(self, shape: tuple[int, ...], sources: tuple[str, ...]) -> "ModuleInfo":
        """The info of one stored tensor a conversion made from ``sources`` (e.g. one expert's w1,
        cut from the fused ``gate_up_proj`` this info describes)."""
        if self.kind == "expert" and len(shape) == 2:
            return replace(self, sources=sources, fan_in=shape[1], fan_out=shape[0])
        return replace(self, sources=sources)


def _torch_fans(shape: tuple[int, ...]) -> tuple[int, int]:
    """torch.nn.init's fan_in / fan_out of a weight of this shape."""
    receptive = math.prod(shape[2:]) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


def _in_experts(parts: list[str]) -> bool:
    return any(p == "experts" and i + 1 < len(parts) and parts[i + 1].isdigit() for i, p in enumerate(parts))


def _is_moe(module: Any) -> bool:
    name = type(module).__name__.lower()
    return hasattr(module, "experts") or "moe" in name or "sparse" in name


def layer_of(name: str) -> int | None:
    """The block index: the number after the first block container in the name."""
    parts = name.split(".")
    for i in range(1, len(parts)):
        if parts[i].isdigit() and parts[i - 1] in BLOCK_CONTAINERS:
            return int(parts[i])
    return None


def describe(name: str, shape: tuple[int, ...], info: ModuleInfo):
    """(kind, role, param, layer, fan_in, fan_out, padding_idx) of a stored tensor."""
    parts = name.split(".")
    attr = parts[-1]
    param = "bias" if attr.endswith("bias") else "weight"
    layer = layer_of(name)
    role = _role([p.lower() for p in parts[:-1]], info, layer, attr)
    padding = info.padding_idx if info.kind == "embedding" else None
    return info.kind, role, param, layer, info.fan_in, info.fan_out, padding


def _role(path: list[str], info: ModuleInfo, layer: int | None, attr: str) -> str:
    leaf = path[-1] if path else attr.lower()
    joined = ".".join(path)
    kind = info.kind
    if kind == "router":
        return "router"
    if kind == "embedding":
        if leaf in _TOKEN_TABLES:
            return "token_embedding"
        if leaf in _POSITION_TABLES:
            return "position_embedding"
        if leaf == "token_type_embeddings":
            return "token_type_embedding"
        return "other"
    if kind == "norm":
        return _norm_role(path, leaf, layer, info)
    if info.lm_bias or attr == "final_logits_bias":
        return "lm_head"
    if "patch_embeddings" in path or "patch_embedding" in path:
        return "patch_embedding"
    if kind == "other":
        if attr.lower() in _POSITION_TABLES:
            return "position_embedding"
        return "other"
    if "pooler" in path:
        return "pooler"
    if path and (path[0] in _CLASSIFIERS or leaf in _CLASSIFIERS):
        return "classifier"
    if "predictions" in path and "transform" in path or (path[:1] == ["lm_head"] and leaf == "dense"):
        return "head_transform"
    if layer is None and (leaf in _LM_HEADS or "predictions" in path):
        return "lm_head"
    if layer is None:
        return "other"
    if any("attn" in p or "attention" in p for p in path):
        if leaf in _ATTN_OUT or joined.endswith("output.dense"):
            return "attn_out"
        return "qkv"
    if leaf in _MLP_OUT or joined.endswith("output.dense") or (path[-2:-1] == ["output"] and leaf == "dense"):
        return "mlp_out"
    return "mlp_in"


def _norm_role(path: list[str], leaf: str, layer: int | None, info: ModuleInfo) -> str:
    if leaf in _QK_NORMS:
        return "qk_norm"
    if "predictions" in path or path[:1] == ["lm_head"]:
        return "head_norm"
    if layer is None:
        if "embeddings" in path or leaf in _EMBEDDING_NORMS:
            return "embedding_norm"
        return "final_norm"
    if leaf in _ATTN_NORMS or ("attention" in path and leaf == "layernorm"):
        return "attn_norm"
    if leaf in _MLP_NORMS or (path[-2:-1] == ["output"] and leaf == "layernorm"):
        return "mlp_norm"
    parent = info.parent_class.lower()
    if "attention" in parent:
        return "attn_norm"
    if "ff" in parent or "mlp" in parent:
        return "mlp_norm"
    return "other"
