"""A Megatron-Core ``GPTModel`` (or ``HybridModel`` of attention and MLP layers, or with Mamba layers as Nemotron-H, :mod:`.hybrid`): where each tensor of the Hugging Face spec it corresponds to sits
in the rank's local (tensor- and pipeline-parallel) parameters.

Two steps, the first read off Megatron's own code:

1. ``model.sharded_state_dict()`` (Megatron's distributed checkpoint) says, for every local
   parameter, which global tensor it is a piece of (the key; a decoder's layers stacked on a
   leading axis), that tensor's global shape, and the offset of the local piece in it (the
   tensor-parallel rank's rows or columns; the pipeline stage's layer offset; a model whose layers
   differ, dense and MoE, saves each layer under its own key instead, :func:`.names.stacked`). The SwiGLU
   ``linear_fc1`` is a factory of two pieces, gate and up, each at its own offset (at TP > 1 a
   rank holds ``[gate_r; up_r]``: partition stride 2). It runs on the model itself and only wraps
   views of its local tensors: no copy, no communication. The local parameter is then a shard of
   the global per-layer tensor, holding the global indices :func:`.layout.megatron_layout` returns.
2. Megatron-Core ships no Hugging Face conversion. Its checkpoint keys map to Hugging Face names by
   :data:`.names._NAMES` (the rows of Megatron-Bridge's Llama/Qwen mappings) and, for MoE layers, by the
   spec family's names (:data:`~modelinit_server.training.families.FAMILIES`: Mixtral's, Qwen2-MoE's shared expert and its gate);
   the layouts that are not a block: the grouped QKV, :func:`.names.qkv_rows`, and GroupedMLP's weights
   (each expert's tensor transposed in the view its grouped GEMM takes), :func:`.grouped.grouped_mlp_box`.
   A Mamba mixer's ``in_proj`` and ``conv1d``, saved as parts, are read as the parts put together
   (:func:`.reader.global_place`); Nemotron-H's names are :data:`.names._NEMOTRON_H`.
   Multi-latent attention's tensors (:data:`.names._MLA_NAMES`, DeepSeek-V3's names) hold the Hugging
   Face rows in their order (:func:`.names.mla_rows`), each one block.

Without a spec, the one filled is the config :mod:`.config` derives from the model's own
``TransformerConfig`` (``MegatronStack.own_config``).

A vocabulary padded by Megatron (to a multiple of ``make_vocab_size_divisible_by`` x TP) has rows
past the spec's vocabulary in the embedding and output layer: row ``r >= vocab`` holds elements
``r * hidden ...`` of the same tensor's stream, drawn by the same rule, as if the Hugging Face
tensor had those rows. Every row is then the same at every TP size and every padding.

megatron is imported only here, only when such a model is passed.

The package: ``stack`` (the Stack) over ``layout`` (the pieces) over ``grouped`` (GroupedMLP's
experts), ``reader`` (sharded_state_dict), ``names`` (the tables), ``refusals`` and ``config``
(the derived Hugging Face config), over ``hybrid`` (HybridModel's pattern: which Hugging Face layer
each symbol is, by position as Megatron's migration from GPTModel pairs them, or one per symbol as
Nemotron-H has them) and ``rope`` (the RoPE a model keeps, read back).
"""
from __future__ import annotations

from .grouped import grouped_mlp_box
from .names import mla_rows, qkv_rows
from .refusals import TE_GROUPED_EXPERTS_VERIFIED, TE_LAYER_SPEC_VERIFIED
from .stack import STACK, MegatronStack, is_megatron_model

__all__ = ["STACK", "MegatronStack", "TE_GROUPED_EXPERTS_VERIFIED", "TE_LAYER_SPEC_VERIFIED", "grouped_mlp_box", "is_megatron_model", "mla_rows", "qkv_rows"]
