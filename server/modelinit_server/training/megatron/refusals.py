"""What the Megatron-Core stack refuses, before anything is written, each with one line naming the
module or parameter and the fix: a model that is not a GPTModel or HybridModel or has what is not
mapped (interleaved RoPE, a multi-token prediction block, a hybrid pattern's gated delta net layers:
:mod:`.hybrid`), the Transformer Engine layer spec and its grouped experts (mapped and tested on CPU
over stand-ins of Transformer Engine's modules, not verified on a GPU run: Transformer Engine cannot
be built here), Megatron-FSDP's uneven pieces of flat buffers, and an expert's weight that FSDP2
shards over ranks holding other experts."""
from __future__ import annotations

from typing import Any

from ..dtensor import is_dtensor
from .hybrid import is_hybrid_model, pattern_of

#: Transformer Engine's modules as Megatron-Core names them (its wrappers in
#: ``megatron.core.extensions.transformer_engine``, and the grouped-GEMM experts ``TEGroupedMLP``);
#: any class defined in ``transformer_engine`` is one too.
_TE_CLASSES = frozenset({"TENorm", "TELinear", "TELayerNormColumnParallelLinear", "TEColumnParallelLinear",
                         "TERowParallelLinear", "TEDotProductAttention", "TEGroupedLinear",
                         "TEColumnParallelGroupedLinear", "TERowParallelGroupedLinear", "TEFusedMLP", "TEGroupedMLP"})
#: Whether a model built with the Transformer Engine layer spec is filled. Its keys are mapped (the
#: fused ``layer_norm_weight`` names of :data:`.names._NAMES`) and read off Megatron's own
#: ``sharded_state_dict()``, tested on CPU with Megatron's modules over stand-ins of Transformer Engine's
#: (which cannot be built without CUDA); the real layers have not run on a GPU yet: the one switch to set
#: once they have (``benchmarks/gpu_session.sh``).
TE_LAYER_SPEC_VERIFIED = False
#: Transformer Engine's grouped experts as Megatron-Core builds them (``moe_grouped_gemm`` with the
#: Transformer Engine spec: the only grouped experts 0.17 and later have).
_TE_GROUPED = frozenset({"TEGroupedMLP", "TEGroupedLinear", "TEColumnParallelGroupedLinear", "TERowParallelGroupedLinear"})
#: Whether ``TEGroupedMLP`` experts are filled. Each local expert's weight is its own parameter
#: (``linear_fc1.weight{i}``, Transformer Engine's ``GroupedLinear``), whose place Megatron's
#: ``sharded_state_dict()`` says as for ``SequentialMLP``: read as any other (tested on CPU over a
#: stand-in of ``GroupedLinear``). The real layer has not run on a GPU yet: the one switch to set once
#: it has (``benchmarks/gpu_session.sh``).
TE_GROUPED_EXPERTS_VERIFIED = False


def refuse_experts_sharded_across_experts(name: str, t, config) -> None:
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


def check_config(model) -> Any:
    check_modules(model)
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
                         "writes holds (transformers' causal LM has no MTP layers: it builds them apart, as the drafting model "
                         "MtpModel); build the GPTModel without mtp_block_spec "
                         "to fill it, and initialize the MTP block by Megatron's own init")
    return config


def check_modules(model) -> None:
    """Refuse, before anything is written, what is mapped but has not been verified: Megatron-FSDP's
    parameters, the Transformer Engine layer spec and its grouped experts (each one line naming the
    module or parameter and the fix)."""
    refuse_megatron_fsdp(model)
    hybrid = is_hybrid_model(model)
    if not hybrid and type(model).__name__ == "MambaModel":
        raise ValueError("module: this Megatron-Core's MambaModel (layers by hybrid_override_pattern) is not supported; "
                         "Megatron-Core 0.19's HybridModel of attention, MLP and MoE layers is, or of Mamba, "
                         "attention and MLP layers")
    if hybrid:
        pattern_of(model)  # a layer symbol without a Hugging Face counterpart, by name
    grouped: list[str] = []
    for path, m in model.named_modules():
        te = next((c.__name__ for c in type(m).__mro__ if c.__name__ in _TE_CLASSES
                   or c.__module__.startswith(("transformer_engine", "megatron.core.extensions.transformer_engine"))), None)
        if te in _TE_GROUPED:
            _check_te_grouped(path, te, m)
            grouped.append(path + ".")
        elif te is not None and not TE_LAYER_SPEC_VERIFIED and not path.startswith(tuple(grouped)):
            fix = ("Megatron-Core ships only a Transformer Engine hybrid stack spec (HybridStack's final norm is "
                   "TENorm whatever the spec); build the HybridModel from local modules (ColumnParallelLinear, "
                   "RowParallelLinear, a local norm) with its final norm replaced, or fill it once a GPU run has "
                   "verified the Transformer Engine layers") if hybrid else (
                "build the GPTModel with the local spec: get_gpt_layer_local_spec (SequentialMLP experts, or "
                "megatron-core 0.16's GroupedMLP), or get_gpt_decoder_block_spec(config, use_transformer_engine=False)")
            raise ValueError(f"module: {path or type(model).__name__!r} is Transformer Engine's {te} (the Transformer "
                             f"Engine layer spec), which has not been verified on a GPU run yet; {fix}")


def _check_te_grouped(path: str, te: str, module) -> None:
    """Transformer Engine's grouped experts: refused until a GPU run has verified them, and, whatever
    that run said, when each expert's weight is not a parameter of its own (Transformer Engine 2.14's
    ``single_grouped_weight``: one packed ``GroupedTensor``, which Megatron saves as views of it)."""
    if not TE_GROUPED_EXPERTS_VERIFIED:
        raise ValueError(f"module: {path!r} is Transformer Engine's {te} (grouped experts, moe_grouped_gemm with the "
                         "Transformer Engine spec), which has not been verified on a GPU run yet; build the experts "
                         "as SequentialMLP (moe_grouped_gemm=False), or fill the model once a GPU run has verified "
                         "Transformer Engine's grouped experts")
    if getattr(module, "single_grouped_weight", False) or getattr(module, "single_grouped_bias", False):
        raise ValueError(f"module: {path!r} ({te}) packs its experts' weights into one parameter "
                         "(moe_single_grouped_weight/moe_single_grouped_bias, Transformer Engine >= 2.14), whose "
                         "layout is not mapped; build the model with moe_single_grouped_weight=False and "
                         "moe_single_grouped_bias=False (Megatron's defaults): each expert's weight{i} then is "
                         "its own parameter")


def refuse_megatron_fsdp(model) -> None:
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
