"""A Megatron-Core ``GPTModel`` rank's local tensors as pieces of the Hugging Face spec's tensors:
each local tensor's global place (:mod:`.reader`, or :mod:`.grouped` for GroupedMLP's weights),
the Hugging Face tensors that place holds (:mod:`.names`), checked against the spec, with the
vocabulary padding's rows as the same stream's next rows."""
from __future__ import annotations

import re
from typing import Any

from ...core.tensors import ModelSpec
from ..fill import Piece
from ..dtensor import local_tensor
from ..stack import Layout, Placed, Run, lacking, not_in_spec
from .grouped import grouped_mlp_box, grouped_place, grouped_runs
from .hybrid import ATTENTION, BY_SYMBOL, MAMBA, MLP, MOE, hf_layer_of, is_hybrid_model, pattern_of
from .names import HF_LAYER, PADDED, hf_boxes, stacked
from .reader import global_place, pieces_of, within
from .refusals import check_config, refuse_experts_sharded_across_experts

_NEMOTRON_H_MIXER_NAME = re.compile(r"^backbone\.layers\.(\d+)\.mixer\.(.+)$")


def megatron_layout(model, spec: ModelSpec, tensors: dict[str, Any], partial: bool = False) -> Layout:
    """A ``GPTModel`` or ``HybridModel`` (whose layers' indices are its pattern's symbols', :mod:`.hybrid`): where each of ``model``'s local tensors (``tensors``: name -> tensor) gets its bytes from,
    as pieces of ``spec``'s tensors in Megatron's global per-layer tensor; that tensor's shape and
    the global indices the local tensor holds per dim (its shard of it); and how many of the spec's tensors the
    model lacks; and the views a fused tensor is filled through (GroupedMLP's weights, as its
    grouped GEMM views them), or, for FSDP2's shard of one, its runs (:func:`.grouped.grouped_runs`). A pipeline stage (Megatron's ``pre_process``/``post_process``, a layer
    range) and an expert-parallel rank lack the other ranks' tensors whether or not ``partial`` is
    set: Megatron's own offsets say which layers and experts it holds; any other model that lacks
    one is refused."""
    config = check_config(model)
    by_name = {t.name: i for i, t in enumerate(spec.tensors)}
    gated = bool(getattr(config, "gated_linear_unit", False))
    by_symbol = spec.family == BY_SYMBOL
    pattern = pattern_of(model, by_symbol) if is_hybrid_model(model) else None
    if by_symbol and pattern is None:
        raise ValueError(f"module: a Nemotron-H spec ({spec.architecture}) maps a Megatron HybridModel, whose pattern "
                         f"says which layer is Mamba, attention, MLP or MoE; this is a {type(model).__name__}")
    if by_symbol:  # before sharded_state_dict() is read: a spec of other layers is refused first
        _check_nemotron_h_layers(spec, pattern.symbols)
    found, stand_ins = pieces_of(model)
    layers = sum(1 for t in spec.tensors if t.name.endswith(".input_layernorm.weight") and HF_LAYER.match(t.name))
    own = pattern.layers if pattern else config.num_layers
    if layers and layers != own:
        raise ValueError(f"module: the Megatron model has {own} layers ("
                         f"{'attention layers of its hybrid_layer_pattern' if pattern else 'num_layers'}), the spec "
                         f"({spec.architecture}) has {layers}: the model does not match the spec")
    pieces: dict[str, list[Piece]] = {}
    placed: dict[str, Placed] = {}
    held: set[int] = set()
    for name, t in tensors.items():
        whole = stand_ins.get(id(t), t)  # a DTensor's whole (tensor-parallel local) parameter
        sharded = found.get(id(whole))
        if sharded is None:
            raise ValueError(f"module: Megatron's sharded_state_dict() does not save {name!r}; modelinit has no bytes for it")
        local = local_tensor(t)
        grouped = grouped_place(name, whole, sharded)
        if grouped is None:
            key, lead, shape, held_idx = global_place(name, whole, sharded)
            key, lead = stacked(key, lead)
            if pattern is not None and key.startswith("decoder.layers."):  # a pattern symbol's index: its HF layer's
                lead = (hf_layer_of(pattern, key, lead[0]), *lead[1:])
            if whole is not t and key.startswith("decoder.layers.mlp.experts."):
                refuse_experts_sharded_across_experts(name, t, config)
            sets = within(held_idx, shape, t, name) if whole is not t else held_idx  # FSDP2's shard of the TP one
            placed[name] = Placed(shape, (Run(0, local.numel(), tuple(local.shape), sets),))
            boxes = hf_boxes(key, lead, shape, config, gated, spec.family)
        else:  # GroupedMLP: each expert's tensor, transposed, in one tensor per layer
            key = grouped.key
            if whole is not t:  # FSDP2's shard of it: runs of its memory
                refuse_experts_sharded_across_experts(name, t, config)
                placed[name] = Placed(grouped.whole, grouped_runs(name, t, grouped))
            else:  # filled through the view its grouped GEMM takes
                placed[name] = Placed(grouped.whole, (Run(0, local.numel(), grouped.view, grouped.held),))
            boxes = [(hf_name, grouped_mlp_box(g, box)) for g in grouped.experts
                     for hf_name, box in hf_boxes(key, (grouped.layer, g), grouped.expert_shape, config, gated, spec.family)]
        pieces[name] = []
        for hf_name, box in boxes:
            ti = by_name.get(hf_name)
            if ti is None:
                tied = hf_name == "lm_head.weight"  # the one tensor tying decides; a q/k norm, a bias: the family
                raise not_in_spec(f"Megatron's {name!r}", hf_name, spec,
                                  ", with tie_word_embeddings false as the model has an output layer of its own" if tied
                                  else ", of a family that has it (q/k norms: qwen3; q/k/v biases: qwen2)"
                                  if "norm" in hf_name or hf_name.endswith(".bias") else "")
            want = tuple(spec.tensors[ti].shape)
            length = box[3]
            if key in PADDED and length[0] >= want[0] and length[1:] == want[1:]:
                pieces[name] += _padded(ti, want, length)
            elif tuple(length) != want:
                raise ValueError(f"module: Megatron's {name!r} holds {hf_name!r} as {list(length)}, the spec has "
                                 f"{list(want)}: the model does not match the spec (check hidden size, heads, query "
                                 "groups, kv_channels, ffn_hidden_size, vocabulary)")
            else:
                pieces[name].append((ti, *box))
            held.add(ti)
    stage = not (getattr(model, "pre_process", True) and getattr(model, "post_process", True)) or \
        len(getattr(getattr(model, "decoder", None), "layers", ())) < config.num_layers or \
        (getattr(config, "expert_model_parallel_size", 1) or 1) > 1
    missing = lacking(spec, held, partial or stage, ": the model does not match the spec")
    return Layout(spec, pieces, missing, placed=placed)


#: What a Nemotron-H layer's mixer holds, by the pattern's symbol it is.
_NEMOTRON_H_MIXERS = {"in_proj.weight": MAMBA, "q_proj.weight": ATTENTION, "up_proj.weight": MLP, "gate.weight": MOE}


def _check_nemotron_h_layers(spec: ModelSpec, symbols: str) -> None:
    """The spec's layers, each a Mamba, attention, MLP or MoE layer by what its mixer holds, are the pattern's
    symbols."""
    kinds: dict[int, str] = {}
    for t in spec.tensors:
        m = _NEMOTRON_H_MIXER_NAME.match(t.name)
        if m and m.group(2) in _NEMOTRON_H_MIXERS:
            kinds[int(m.group(1))] = _NEMOTRON_H_MIXERS[m.group(2)]
    theirs = "".join(kinds.get(k, "?") for k in range(max(kinds, default=-1) + 1))
    if theirs != symbols:
        raise ValueError(f"module: the Megatron HybridModel's layers are {symbols!r} (its hybrid_layer_pattern without "
                         f"'|'), the spec's ({spec.architecture}) are {theirs!r} (its hybrid_override_pattern): the "
                         "model does not match the spec")


def _padded(ti: int, want: tuple[int, ...], length: tuple[int, ...]) -> list[Piece]:
    """The spec's rows, then Megatron's padding rows as the same stream's next rows."""
    whole = (ti, (0,) * len(want), tuple(range(len(want))), (0,) * len(want), tuple(want))
    extra = length[0] - want[0]
    if not extra:
        return [whole]
    rest = (0,) * (len(want) - 1)
    return [whole, (ti, (want[0], *rest), tuple(range(len(want))), (want[0], *rest), (extra, *want[1:]))]
