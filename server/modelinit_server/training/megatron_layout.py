"""A Megatron-Core ``GPTModel``: where each tensor of the Hugging Face spec it corresponds to sits
in the rank's local (tensor- and pipeline-parallel) parameters.

Two steps, the first read off Megatron's own code:

1. ``model.sharded_state_dict()`` (Megatron's distributed checkpoint) says, for every local
   parameter, which global tensor it is a piece of (the key; a decoder's layers stacked on a
   leading axis), that tensor's global shape, and the offset of the local piece in it (the
   tensor-parallel rank's rows or columns; the pipeline stage's layer offset; a model whose layers
   differ, dense and MoE, saves each layer under its own key instead, :func:`_stacked`). The SwiGLU
   ``linear_fc1`` is a factory of two pieces, gate and up, each at its own offset (at TP > 1 a
   rank holds ``[gate_r; up_r]``: partition stride 2). It runs on the model itself and only wraps
   views of its local tensors: no copy, no communication. The local parameter is then a shard of
   the global per-layer tensor, holding the global indices :func:`megatron_spec` returns.
2. Megatron-Core ships no Hugging Face conversion. Its checkpoint keys map to Hugging Face names by
   :data:`_NAMES` (the rows of Megatron-Bridge's Llama/Qwen mappings) and, for MoE layers, by the
   spec family's names (:data:`_MOE_NAMES`: Mixtral's, Qwen2-MoE's shared expert and its gate);
   the layouts that are not a block: the grouped QKV, :func:`qkv_rows`, and GroupedMLP's weights
   (each expert's tensor transposed in the view its grouped GEMM takes), :func:`grouped_mlp_box`.
   Multi-latent attention's tensors (:data:`_MLA_NAMES`, DeepSeek-V3's names) hold the Hugging
   Face rows in their order (:func:`mla_rows`), each one block.

Without a spec, the one filled is the config :mod:`.megatron_config` derives from the model's own
``TransformerConfig`` (``MegatronStack.own_config``).

A vocabulary padded by Megatron (to a multiple of ``make_vocab_size_divisible_by`` x TP) has rows
past the spec's vocabulary in the embedding and output layer: row ``r >= vocab`` holds elements
``r * hidden ...`` of the same tensor's stream, drawn by the same rule, as if the Hugging Face
tensor had those rows. Every row is then the same at every TP size and every padding.

megatron is imported only here, only when such a model is passed.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from ..core.tensors import ModelSpec
from .dtensor import is_dtensor, local_and_index_sets
from .fill import Box, Piece
from .megatron_config import own_config
from .stack import Layout, lacking, not_in_spec

#: Megatron checkpoint key -> Hugging Face name (``{}``: the global layer index). The keys are those
#: of ``sharded_state_dict()``, which names the local spec's norms as Transformer Engine fuses them
#: (``input_layernorm`` as ``self_attention.linear_qkv.layer_norm_weight``).
_NAMES = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "decoder.final_layernorm.bias": "model.norm.bias",
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
#: Transformer Engine's modules as Megatron-Core names them (its wrappers in
#: ``megatron.core.extensions.transformer_engine``, and the grouped-GEMM experts ``TEGroupedMLP``);
#: any class defined in ``transformer_engine`` is one too.
_TE_CLASSES = frozenset({"TENorm", "TELinear", "TELayerNormColumnParallelLinear", "TEColumnParallelLinear",
                         "TERowParallelLinear", "TEDotProductAttention", "TEGroupedLinear",
                         "TEColumnParallelGroupedLinear", "TERowParallelGroupedLinear", "TEFusedMLP", "TEGroupedMLP"})
#: Whether a model built with the Transformer Engine layer spec is filled. Its keys are mapped (the
#: fused ``layer_norm_weight`` names of :data:`_NAMES`), but its bytes have not been verified on a
#: GPU run yet (Transformer Engine cannot be built without CUDA): the one switch to set once they have.
TE_LAYER_SPEC_VERIFIED = False
#: The MLP's names, by the spec's naming: gated (SwiGLU: ``linear_fc1`` holds [gate; up]), or not.
_MLP = {True: ("gate_proj", "up_proj", "down_proj"), False: (None, "c_fc", "c_proj")}
_QKV = "decoder.layers.self_attention.linear_qkv."
_PADDED = ("embedding.word_embeddings.weight", "output_layer.weight")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_LAYER_KEY = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


def is_megatron_model(module) -> bool:
    """Whether ``module`` is a Megatron-Core model (its class is defined in ``megatron.core``, or
    Megatron-FSDP's, in the ``megatron_fsdp`` package: refused by name, :func:`_refuse_megatron_fsdp`)."""
    inner = getattr(module, "_orig_mod", module)
    return any(c.__module__.startswith(("megatron.core.", "megatron_fsdp.")) for c in type(inner).__mro__)


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


def _pieces_of(model) -> tuple[dict[int, list[Any]], dict[int, Any]]:
    """Megatron's ShardedTensors of the model, per local tensor (by identity): the tensor itself or,
    for a factory (``linear_fc1``), the views of it that its build function makes. A DTensor
    parameter (FSDP2) is seen through its stand-in (:func:`_unsharded_stand_ins`), returned too,
    by the DTensor's identity."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    try:
        with _unsharded_stand_ins(model) as stand_ins:
            state = model.sharded_state_dict()
    except Exception as e:  # noqa: BLE001 - Megatron's own error, said as ours with the fix
        raise ValueError(f"module: Megatron's sharded_state_dict() failed ({type(e).__name__}: {e}); modelinit reads "
                         "each parameter's global place from it: call init_module_ after initialize_model_parallel") from None
    out: dict[int, list[Any]] = {}

    def add(owner, sharded) -> None:
        out.setdefault(id(owner), []).append(sharded)

    for value in _leaves(state):
        if isinstance(value, ShardedTensorFactory):
            for built in _leaves(value.build_fn(value.key, value.data, value.replica_id, value.flattened_range)):
                if isinstance(built, ShardedTensor):
                    add(value.data, built)
        elif isinstance(value, ShardedTensor) and value.data is not None:
            add(value.data, value)
    return out, stand_ins


def _grouped_runs(name: str, t, grouped: tuple) -> tuple[tuple[int, int, tuple[int, ...], list], ...]:
    """FSDP2's shard of a ``GroupedMLP`` weight (a DTensor, ``Shard(0)`` rows of the 2-D weight) as
    runs of its local elements (``Layout.runs``): the rows are a run of the weight's memory, which
    the grouped GEMM views as (local experts, X, Y); it is cut where it enters or leaves an expert,
    into at most three runs, each whole experts or whole ``Y``-rows of one (a row of the 2-D weight
    is whole ``Y``-rows of the view), each with the global indices it holds of the layer's tensor."""
    _, _, view, whole, held_idx, _, _ = grouped
    _, sets = local_and_index_sets(t, name)
    _, x, y = view
    rows, width = sets[0], t.shape[1]
    if any(s is not None for s in sets[1:]) or width % y or \
            (rows is not None and rows.size and np.any(np.diff(rows) != 1)):
        raise ValueError(f"module: {name!r} (GroupedMLP) is a DTensor sharded other than by runs of rows (Shard(0)); "
                         "this layout is not supported: use SequentialMLP experts (moe_grouped_gemm=False) under it")
    start, stop = (0, t.shape[0] * width) if rows is None else \
        (int(rows[0]) * width, (int(rows[-1]) + 1) * width) if rows.size else (0, 0)
    dim1 = np.arange(whole[1], dtype=np.int64) if held_idx[1] is None else held_idx[1]
    block, at, runs = x * y, start, []
    while at < stop:
        expert, within = divmod(at, block)
        if within == 0 and stop - at >= block:  # whole experts
            n = (stop - at) // block
            runs.append((at - start, at - start + n * block, (n, x, y), [held_idx[0][expert:expert + n], *held_idx[1:]]))
            at += n * block
        else:  # Y-rows of one expert, to its end or the shard's
            end = min(stop, (expert + 1) * block)
            lo, hi = within // y, (end - expert * block) // y
            runs.append((at - start, end - start, (1, hi - lo, y), [held_idx[0][expert:expert + 1], dim1[lo:hi],
                                                                      held_idx[2]]))
            at = end
    return tuple(runs)


def _refuse_experts_sharded_across_experts(name: str, t, config) -> None:
    """An expert's DTensor weight whose mesh holds a rank of this rank's expert-parallel group:
    those ranks hold other experts, so FSDP2's all-gather before each forward joins pieces of
    different experts, and no fill gives the expert its folder's bytes. Megatron's
    ``TorchFullyShardedDataParallel`` shards every parameter over the data-parallel group, which
    with expert parallelism spans the expert-parallel ranks (megatron-core 0.16)."""
    if (getattr(config, "expert_model_parallel_size", 1) or 1) == 1:
        return
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    group = ps.get_expert_model_parallel_group(check_initialized=False)
    others = set(dist.get_process_group_ranks(group)) - {dist.get_rank()} if group is not None else set()
    mesh = set(t.device_mesh.mesh.flatten().tolist())
    if group is None or mesh & others:
        shown = sorted(mesh & others)[:4] if group is not None else "unknown (no expert-parallel group)"
        raise ValueError(
            f"module: {name!r} is an expert's weight that FSDP2 shards over ranks holding other experts "
            f"(expert_model_parallel_size={config.expert_model_parallel_size}; ranks {shown} of its mesh): its "
            "all-gather joins pieces of different experts, so no fill gives it one expert's bytes (Megatron's "
            "--use-torch-fsdp2 shards every parameter over the data-parallel group); use expert_model_parallel_size=1 "
            "under --use-torch-fsdp2, or shard the experts over the expert data-parallel group "
            "(parallel_state.get_expert_data_parallel_group())")


@contextlib.contextmanager
def _unsharded_stand_ins(model) -> Iterator[dict[int, Any]]:
    """While inside, each DTensor parameter of ``model`` (FSDP2's shard of Megatron's tensor-parallel
    local parameter) is replaced by a meta tensor of its whole shape, dtype and attributes: the
    parameter as Megatron holds it without FSDP2. Megatron's ``sharded_state_dict()`` then says
    where that whole local parameter sits, as for DDP, allocating nothing; on the DTensor itself
    it would shift the offsets by the data-parallel rank (even shards only) and gather a tensor
    smaller than the mesh (``full_tensor()``: a collective). The parameters are put back on exit.
    Yields DTensor's identity -> its stand-in."""
    import torch

    swapped: list[tuple[Any, str, Any]] = []
    stand_ins: dict[int, Any] = {}
    try:
        for m in model.modules():
            for leaf, p in list(m._parameters.items()):
                if p is None or not is_dtensor(p):
                    continue
                stand = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"), requires_grad=False)
                stand.__dict__.update(vars(p))  # Megatron's tensor_model_parallel, partition_dim, ...
                swapped.append((m, leaf, p))
                stand_ins[id(p)] = stand
                m._parameters[leaf] = stand
        yield stand_ins
    finally:
        for m, leaf, p in swapped:
            m._parameters[leaf] = p


def _leaves(tree):
    if isinstance(tree, dict):
        for v in tree.values():
            yield from _leaves(tree=v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from _leaves(v)
    else:
        yield tree


def _global_place(name: str, t, sharded: list[Any]) -> tuple[str, tuple[int, ...], tuple[int, ...], list]:
    """``t``'s key, the global tensor's prepended offsets (layer, ...), its per-layer shape, and the
    global indices ``t`` holds per dim (None: all of it), from its ShardedTensors. Each one is a
    block of ``t``'s rows (a factory's chunk) at its own offset."""
    keys = {s.key for s in sharded}
    if len(keys) != 1:
        raise ValueError(f"module: Megatron saves {name!r} as several tensors ({sorted(keys)}); this layout is not supported")
    lead = {tuple(s.global_offset[:s.prepend_axis_num]) for s in sharded}
    shapes = {tuple(s.global_shape[s.prepend_axis_num:]) for s in sharded}
    if len(lead) != 1 or len(shapes) != 1:
        raise ValueError(f"module: Megatron saves {name!r} in pieces of several layers; this layout is not supported")
    shape = shapes.pop()
    if any(s.flattened_range is not None for s in sharded):
        raise ValueError(f"module: Megatron saves {name!r} flattened (a distributed optimizer's shard); call init_module_ "
                         "on the model's parameters, not the optimizer's")
    if len(shape) != t.dim():
        raise ValueError(f"module: {name!r} is {list(t.shape)}, Megatron saves it as {list(shape)}")
    rows: list[tuple[int, np.ndarray]] = []  # (first local row, global rows) per piece
    other: list[np.ndarray | None] = [None] * t.dim()
    row_stride = t.stride(0) if t.dim() else 1
    for s in sharded:
        local = tuple(s.local_shape)
        offset = tuple(s.global_offset[s.prepend_axis_num:])
        at = s.data.storage_offset() - t.storage_offset()
        if s.data.untyped_storage().data_ptr() != t.untyped_storage().data_ptr() or at % max(row_stride, 1) \
                or tuple(s.data.shape) != local or local[1:] != tuple(t.shape[1:]):
            raise ValueError(f"module: Megatron's piece of {name!r} is not a block of its rows; this layout is not supported")
        rows.append((at // max(row_stride, 1), np.arange(offset[0], offset[0] + local[0], dtype=np.int64) if local else None))
        for d in range(1, t.dim()):
            held = np.arange(offset[d], offset[d] + local[d], dtype=np.int64)
            if other[d] is not None and not np.array_equal(other[d], held):
                raise ValueError(f"module: Megatron's pieces of {name!r} differ in dim {d}; this layout is not supported")
            other[d] = held
    sets: list[np.ndarray | None] = list(other)
    if t.dim():
        rows.sort(key=lambda r: r[0])
        held = np.concatenate([r[1] for r in rows])
        firsts = [r[0] for r in rows]
        if firsts != list(np.cumsum([0] + [len(r[1]) for r in rows[:-1]])) or held.size != t.shape[0] \
                or np.any(np.diff(held) <= 0):
            raise ValueError(f"module: Megatron's pieces of {name!r} do not tile it in order; this layout is not supported")
        sets[0] = held
    sets = [None if s is not None and s.size == n and s[0] == 0 and s[-1] == n - 1 else s
            for s, n in zip(sets, shape)]
    return keys.pop(), lead.pop(), shape, sets


def _grouped_place(name: str, t, sharded: list[Any]):
    """For a ``GroupedMLP`` weight (``weight1`` [hidden, local experts x fc1 rows], in memory
    [local experts, hidden, rows]; ``weight2`` [local experts x fc2 columns, hidden], in memory
    [local experts, columns, hidden]: its grouped GEMM's views): the key, the layer, the view's
    shape, the whole layer's tensor in the same layout (every expert, every TP rank's rows or
    columns), the global indices the view holds per dim, the global experts held and one expert's
    Megatron shape. None for any other tensor. Read off the ShardedTensors of Megatron's own
    ``sharded_state_dict()`` (which saves each expert's ``linear_fc1``/``linear_fc2`` transposed out
    of the view, as copies): each is (local experts, rows, columns) at (layer, first expert, row
    offset, column offset) of (layers, experts, rows, columns)."""
    keys = {s.key for s in sharded}
    if t.dim() != 2 or len(keys) != 1 or not next(iter(keys)).endswith(
            ("mlp.experts.experts.linear_fc1.weight", "mlp.experts.experts.linear_fc2.weight")) \
            or any(s.data.dim() != 3 or s.prepend_axis_num != 1 for s in sharded):
        return None
    key = keys.pop()
    layers, firsts, shapes = ({s.global_offset[0] for s in sharded}, {s.global_offset[1] for s in sharded},
                              {tuple(s.global_shape[1:]) for s in sharded})
    counts = {s.local_shape[0] for s in sharded}
    if len(layers) != 1 or len(firsts) != 1 or len(shapes) != 1 or len(counts) != 1:
        raise ValueError(f"module: Megatron saves {name!r} (GroupedMLP) in pieces of several layers or experts; "
                         "this layout is not supported")
    (n_experts, rows, cols), first, n_local = shapes.pop(), firsts.pop(), counts.pop()
    # fc1 pieces split the rows (gate and up, each a TP rank's), fc2 its one piece the columns
    axis = 1 if key.endswith("linear_fc1.weight") else 2
    other = 2 if axis == 1 else 1
    held = np.concatenate([np.arange(s.global_offset[1 + axis], s.global_offset[1 + axis] + s.local_shape[axis],
                                     dtype=np.int64) for s in sharded])
    width = {s.local_shape[other] for s in sharded}
    if np.any(np.diff(held) <= 0) or width != {(rows, cols)[other - 1]} or held.size * n_local * width.pop() != t.numel():
        raise ValueError(f"module: Megatron's pieces of {name!r} (GroupedMLP) do not tile it; this layout is not supported")
    experts = np.arange(first, first + n_local, dtype=np.int64)
    full = (rows, cols)[axis - 1]
    held = None if held.size == full else held
    if axis == 1:  # [experts, hidden, rows]
        return key, layers.pop(), (n_local, cols, t.numel() // (n_local * cols)), (n_experts, cols, rows), \
            [experts, None, held], experts.tolist(), (rows, cols)
    return key, layers.pop(), (n_local, t.numel() // (n_local * rows), rows), (n_experts, cols, rows), \
        [experts, held, None], experts.tolist(), (rows, cols)


def grouped_mlp_box(expert: int, box: Box) -> Box:
    """A box of one expert's Megatron tensor (``linear_fc1`` [rows, hidden], ``linear_fc2``
    [hidden, columns]) as a box of the layer's GroupedMLP tensor as its grouped GEMM views it
    ([experts, hidden, rows], [experts, columns, hidden]): the expert's tensor transposed, at
    ``expert`` along the first dim."""
    start, dims, disk_start, length = box
    if len(start) != 2 or any(isinstance(s, np.ndarray) for s in start):
        raise ValueError("module: a GroupedMLP expert's box must be a 2-D block")
    return (expert, start[1], start[0]), tuple(2 - d if d >= 0 else -1 for d in dims), disk_start, length


def _whole(shape: tuple[int, ...]) -> Box:
    return (0,) * len(shape), tuple(range(len(shape))), (0,) * len(shape), tuple(shape)


def _hf_boxes(key: str, lead: tuple[int, ...], shape: tuple[int, ...], config, gated: bool,
              family: str = "") -> list[tuple[str, Box]]:
    """The Hugging Face tensors (name, box of them in Megatron's per-layer tensor ``key`` of ``shape``)
    the tensor holds (``lead``: its leading offsets, layer then expert); their shapes are checked
    against the spec by the caller."""
    layer = lead[0] if lead else None

    def hf(name: str) -> str:
        return name.format(layer) if "{}" in name else name

    if getattr(config, "multi_latent_attention", False) and key in _MLA_NAMES:  # one block each: mla_rows
        return [(hf(_MLA_NAMES[key]), _whole(shape))]
    if key in _NAMES:
        return [(hf(_NAMES[key]), _whole(shape))]
    leaf = key.rpartition(".")[2]
    if key.startswith(_QKV) and leaf in ("weight", "bias"):
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
            out.append((f"model.layers.{layer}.self_attn.{proj}_proj.{leaf}", box))
        return out
    names = _MOE_NAMES.get(family, _MoeNames())
    mlp = _mlp_prefix(key, lead, names)
    if mlp is None:
        raise ValueError(f"module: Megatron's {key!r} has no Hugging Face counterpart modelinit knows; GPTModel with the "
                         "local or Transformer Engine layer spec (GQA, a SwiGLU or GELU MLP, MoE experts) is supported")
    prefix, rest = mlp
    gate, up, down = names.expert_mlp if prefix.startswith(names.experts.partition("{")[0]) and gated else _MLP[gated]
    layer_prefix = f"model.layers.{layer}.{prefix}"
    if prefix == "mlp." and rest == "router.weight":
        return [(f"model.layers.{layer}.{names.router}", _whole(shape))]
    if prefix == "mlp." and rest == "router.expert_bias":
        return [(f"model.layers.{layer}.{names.expert_bias}", _whole(shape))]
    if prefix == names.shared and rest == "gate_weight" and names.shared_gate:
        return [(f"model.layers.{layer}.{names.shared_gate}", _whole(shape))]
    fc, _, leaf = rest.partition(".")
    if fc == "linear_fc1" and leaf in ("weight", "bias"):
        if not gated:
            return [(f"{layer_prefix}{up}.{leaf}", _whole(shape))]
        half = shape[0] // 2
        zeros = (0,) * (len(shape) - 1)
        dims = tuple(range(len(shape)))
        return [(f"{layer_prefix}{gate}.{leaf}", ((0, *zeros), dims, (0,) * len(shape), (half, *shape[1:]))),
                (f"{layer_prefix}{up}.{leaf}", ((half, *zeros), dims, (0,) * len(shape), (half, *shape[1:])))]
    if fc == "linear_fc2" and leaf in ("weight", "bias"):
        return [(f"{layer_prefix}{down}.{leaf}", _whole(shape))]
    raise ValueError(f"module: Megatron's {key!r} has no Hugging Face counterpart modelinit knows; GPTModel with the "
                     "local or Transformer Engine layer spec (GQA, a SwiGLU or GELU MLP, MoE experts) is supported")


def _mlp_prefix(key: str, lead: tuple[int, ...], names: "_MoeNames") -> tuple[str, str] | None:
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


@dataclass(frozen=True)
class _MoeNames:
    """How a Hugging Face MoE family names what Megatron's MoELayer holds (after ``model.layers.N.``)."""

    experts: str = "mlp.experts.{}."
    expert_mlp: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    router: str = "mlp.gate.weight"
    expert_bias: str = "mlp.gate.e_score_correction_bias"
    """The router's expert bias (Megatron's ``moe_router_enable_expert_bias``; DeepSeek-V3, GLM-4-MoE)."""
    shared: str = "mlp.shared_experts."
    shared_gate: str | None = None
    """The shared expert's sigmoid gate (Megatron's ``moe_shared_expert_gate``)."""


#: The MoE families whose names are not DeepSeek's/Qwen3-MoE's (the default above).
_MOE_NAMES = {
    "mixtral": _MoeNames(experts="block_sparse_moe.experts.{}.", expert_mlp=("w1", "w3", "w2"),
                         router="block_sparse_moe.gate.weight"),
    "qwen2_moe": _MoeNames(shared="mlp.shared_expert.", shared_gate="mlp.shared_expert_gate.weight"),
}


def _check_config(model) -> Any:
    _check_modules(model)
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "num_attention_heads"):
        raise ValueError(f"module: {type(model).__name__} is not a Megatron-Core GPTModel (it has no TransformerConfig); "
                         "modelinit maps GPTModel")
    for flag, why in (("rotary_interleaved", "interleaved RoPE"),):
        if getattr(config, flag, None):
            raise ValueError(f"module: a Megatron model with {why} ({flag}) is not supported yet; GPTModel with "
                             "grouped-query attention, a dense MLP or SequentialMLP/GroupedMLP experts is")
    if getattr(model, "mtp_process", False) or getattr(model, "mtp", None) is not None:
        raise ValueError(f"module: the Megatron model has a multi-token prediction block (mtp_num_layers="
                         f"{getattr(config, 'mtp_num_layers', None)}), whose tensors no Hugging Face folder modelinit "
                         "writes holds (transformers builds no MTP layers); build the GPTModel without mtp_block_spec "
                         "to fill it, and initialize the MTP block by Megatron's own init")
    return config


def _check_modules(model) -> None:
    """Refuse, before anything is written, what is mapped but has not been verified: Megatron-FSDP's
    parameters and the Transformer Engine layer spec (each one line naming the module or parameter
    and the fix)."""
    _refuse_megatron_fsdp(model)
    if TE_LAYER_SPEC_VERIFIED:
        return
    for path, m in model.named_modules():
        te = next((c.__name__ for c in type(m).__mro__ if c.__name__ in _TE_CLASSES
                   or c.__module__.startswith(("transformer_engine", "megatron.core.extensions.transformer_engine"))), None)
        if te is not None:
            raise ValueError(f"module: {path or type(model).__name__!r} is Transformer Engine's {te} (the Transformer "
                             "Engine layer spec), which has not been verified on a GPU run yet; build the GPTModel with "
                             "the local spec: get_gpt_layer_local_spec (GroupedMLP or SequentialMLP experts), or "
                             "get_gpt_decoder_block_spec(config, use_transformer_engine=False)")


def _refuse_megatron_fsdp(model) -> None:
    """Megatron-FSDP (``megatron.core.distributed.fsdp``, the ``megatron_fsdp`` package) shards
    flat buffers into uneven DTensor pieces, and its adapter asks CUDA for its device, streams and
    memory pools: it cannot be built here, so what a rank holds of it is not verified. Seen by its
    classes, or, on the model inside it, by a DTensor parameter that torch's ``fully_shard`` (whose
    shards are mapped, Megatron's ``--use-torch-fsdp2``) did not make."""
    from torch.distributed.fsdp import FSDPModule

    modules = list(model.modules())
    wrapper = next((type(m).__name__ for m in modules
                    if type(m).__module__.startswith(("megatron.core.distributed.fsdp", "megatron_fsdp"))), None)
    fsdp2 = any(isinstance(m, FSDPModule) for m in modules)
    sharded = next((n for n, p in model.named_parameters() if is_dtensor(p)), None)
    if wrapper is None and (sharded is None or fsdp2):
        return
    name = sharded or next((n for n, _ in model.named_parameters()), type(model).__name__)
    what = f"Megatron-FSDP's ({wrapper}: uneven DTensor pieces of flat buffers)" if wrapper else \
        "a DTensor that torch's fully_shard did not make (as Megatron-FSDP's uneven pieces of flat buffers)"
    raise ValueError(f"module: {name!r} is {what}, which cannot be built or verified without a GPU here; use "
                     "Megatron's --use-torch-fsdp2 (TorchFullyShardedDataParallel), or call init_module_ on the "
                     "GPTModel before wrapping it (Megatron-FSDP copies each parameter's values into its buffers)")


def megatron_spec(model, spec: ModelSpec, tensors: dict[str, Any], partial: bool = False
                  ) -> tuple[ModelSpec, dict[str, list[Piece]], dict[str, tuple[tuple[int, ...], list]], int,
                             dict[str, tuple[int, ...]], dict[str, tuple]]:
    """Where each of ``model``'s local tensors (``tensors``: name -> tensor) gets its bytes from,
    as pieces of ``spec``'s tensors in Megatron's global per-layer tensor; that tensor's shape and
    the global indices the local tensor holds per dim (its shard of it); and how many of the spec's tensors the
    model lacks; and the views a fused tensor is filled through (GroupedMLP's weights, as its
    grouped GEMM views them), or, for FSDP2's shard of one, its runs (:func:`_grouped_runs`). A pipeline stage (Megatron's ``pre_process``/``post_process``, a layer
    range) and an expert-parallel rank lack the other ranks' tensors whether or not ``partial`` is
    set: Megatron's own offsets say which layers and experts it holds; any other model that lacks
    one is refused."""
    config = _check_config(model)
    by_name = {t.name: i for i, t in enumerate(spec.tensors)}
    gated = bool(getattr(config, "gated_linear_unit", False))
    found, stand_ins = _pieces_of(model)
    layers = sum(1 for t in spec.tensors if t.name.endswith(".input_layernorm.weight") and _HF_LAYER.match(t.name))
    if layers and layers != config.num_layers:
        raise ValueError(f"module: the Megatron model has {config.num_layers} layers (num_layers), the spec "
                         f"({spec.architecture}) has {layers}: the model does not match the spec")
    pieces: dict[str, list[Piece]] = {}
    sets: dict[str, tuple[tuple[int, ...], list]] = {}
    views: dict[str, tuple[int, ...]] = {}
    runs: dict[str, tuple] = {}
    held: set[int] = set()
    for name, t in tensors.items():
        whole = stand_ins.get(id(t), t)  # a DTensor's whole (tensor-parallel local) parameter
        sharded = found.get(id(whole))
        if sharded is None:
            raise ValueError(f"module: Megatron's sharded_state_dict() does not save {name!r}; modelinit has no bytes for it")
        grouped = _grouped_place(name, whole, sharded)
        if grouped is not None and whole is not t:
            _refuse_experts_sharded_across_experts(name, t, config)
            runs[name] = _grouped_runs(name, t, grouped)
        if grouped is None:
            key, lead, shape, held_idx = _global_place(name, whole, sharded)
            key, lead = _stacked(key, lead)
            if whole is not t and key.startswith("decoder.layers.mlp.experts."):
                _refuse_experts_sharded_across_experts(name, t, config)
            sets[name] = (shape, _within(held_idx, shape, t, name) if whole is not t else held_idx)
            boxes = _hf_boxes(key, lead, shape, config, gated, spec.family)
        else:  # GroupedMLP: each expert's tensor, transposed, in one tensor per layer
            key, layer, view, whole, held_idx, experts, shape = grouped
            sets[name] = (whole, held_idx)
            if name not in runs:
                views[name] = view
            boxes = [(hf_name, grouped_mlp_box(g, box)) for g in experts
                     for hf_name, box in _hf_boxes(key, (layer, g), shape, config, gated, spec.family)]
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
            if key in _PADDED and length[0] >= want[0] and length[1:] == want[1:]:
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
    return spec, pieces, sets, lacking(spec, held, partial or stage, ": the model does not match the spec"), views, runs


def _within(held: list, shape: tuple[int, ...], t, name: str) -> list:
    """The global indices a DTensor parameter's local shard holds per dim: FSDP2 (torch's
    ``fully_shard``, over the data-parallel group) shards Megatron's tensor-parallel local
    parameter (the DTensor's whole shape: Megatron's tensor parallel is not a DTensor), which
    holds ``held`` of the global tensor (None: all ``shape[d]``); the shard holds the elements its
    placements pick of those (:func:`~.dtensor.local_and_index_sets`: Shard(0), _StridedShard,
    Replicate, uneven sizes included)."""
    _, picked = local_and_index_sets(t, name)
    return [h if p is None else (np.arange(n, dtype=np.int64) if h is None else h)[p]
            for h, p, n in zip(held, picked, shape)]


def _stacked(key: str, lead: tuple[int, ...]) -> tuple[str, tuple[int, ...]]:
    """A layer's key as the stacked layers' key: Megatron saves the layers of a model whose layers
    differ (``moe_layer_freq`` a list or above 1: dense and MoE layers) one key each,
    ``decoder.layers.<global layer>.<rest>``, instead of stacking them on a leading axis; the same
    tensor is then ``decoder.layers.<rest>`` at that layer."""
    m = _LAYER_KEY.match(key)
    return (f"decoder.layers.{m.group(2)}", (int(m.group(1)), *lead)) if m else (key, lead)


def _padded(ti: int, want: tuple[int, ...], length: tuple[int, ...]) -> list[Piece]:
    """The spec's rows, then Megatron's padding rows as the same stream's next rows."""
    whole = (ti, (0,) * len(want), tuple(range(len(want))), (0,) * len(want), tuple(want))
    extra = length[0] - want[0]
    if not extra:
        return [whole]
    rest = (0,) * (len(want) - 1)
    return [whole, (ti, (want[0], *rest), tuple(range(len(want))), (want[0], *rest), (extra, *want[1:]))]


class MegatronStack:
    """A Megatron-Core model, filled with the bytes of the Hugging Face model it corresponds to."""

    name = "Megatron-Core"
    takes_spec = True

    def recognizes(self, module) -> bool:
        return is_megatron_model(module)

    def own_config(self, module) -> dict | None:
        _check_modules(module)  # what is refused is refused by name, before any of its fields
        return own_config(module)

    def prepare(self, module) -> tuple[str, ...]:
        return ()

    def layout(self, module, spec, named, real, partial) -> Layout:
        model_spec, pieces, index_sets, missing, views, runs = megatron_spec(module, spec, dict(named), partial)
        return Layout(model_spec, pieces, missing, index_sets, views=views, runs=runs)


STACK = MegatronStack()
