"""The module's own tensors: the model inside its wrappers, and every tensor to fill under the
name the model itself gives it.

    unwrap / strip_wrappers   DDP, FSDP1, torch.compile and checkpoint wrappers removed (module / name)
    refuse_sharded_fsdp1      FSDP1's flat shards do not say where their elements sit: refused by name
    module_tensors            (name without wrappers, real name, tensor) of every parameter and persistent buffer
    dtype_name                a tensor's dtype as the engine names it, if the engine generates it

Imports nothing of modelinit (torch inside the functions): the bottom of training's layers.
"""
from __future__ import annotations

from typing import Any

#: Module-name components that wrappers insert and that the canonical names never contain:
#: torch.compile, activation checkpointing, FSDP1.
WRAPPER_COMPONENTS = ("_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module")

#: Wrappers around a whole model, and the attribute that holds the model: DDP (torch's and Megatron's),
#: FSDP1, Megatron's FSDP2 wrapper (``--use-torch-fsdp2``), torch.compile, activation checkpointing,
#: Megatron's Float16Module (by class name: none of them needs importing to be recognized).
ROOT_WRAPPERS = {"DistributedDataParallel": "module", "FullyShardedDataParallel": "_fsdp_wrapped_module",
                 "TorchFullyShardedDataParallel": "module",
                 "OptimizedModule": "_orig_mod", "CheckpointWrapper": "_checkpoint_wrapped_module",
                 "OffloadWrapper": "_checkpoint_wrapped_module", "Float16Module": "module"}

#: The torch dtypes the engine generates.
TORCH_DTYPES = ("float32", "bfloat16", "float16")


def unwrap(module):
    """The model inside the wrappers around it (DDP's ``module``, FSDP1's, torch.compile's, a
    checkpoint wrapper's), so that names and the transformers class are the model's own."""
    for _ in range(16):
        attr = ROOT_WRAPPERS.get(type(module).__name__)
        inner = getattr(module, attr, None) if attr else None
        if inner is None:
            return module
        module = inner
    return module


def refuse_sharded_fsdp1(module) -> None:
    """FSDP1 (FullyShardedDataParallel) shards flattened parameters: a rank holds a flat piece of
    several tensors, whose place in them its parameters do not say. Only its NO_SHARD mode (one
    rank) keeps whole tensors."""
    from torch import nn

    if not isinstance(module, nn.Module):
        return
    for m in module.modules():
        if type(m).__name__ == "FullyShardedDataParallel":
            strategy = getattr(getattr(m, "sharding_strategy", None), "name", "NO_SHARD")
            if strategy != "NO_SHARD":
                raise ValueError(
                    f"module: FSDP1 (FullyShardedDataParallel, {strategy}) holds flat pieces of parameters; use FSDP2 "
                    "(torch.distributed.fsdp.fully_shard), or call init_module_ before wrapping (FSDP's param_init_fn)"
                )


def strip_wrappers(name: str) -> str:
    """``name`` without the components torch.compile, activation checkpointing and FSDP insert."""
    return ".".join(p for p in name.split(".") if p not in WRAPPER_COMPONENTS)


def module_tensors(module) -> list[tuple[str, str, Any]]:
    """(name without wrappers, real name, tensor) of every parameter and persistent buffer, tied
    names included. Real names, not state_dict's: wrappers' state_dict hooks rename keys."""
    from torch import nn

    if not isinstance(module, nn.Module):
        raise TypeError(f"module: must be a torch.nn.Module, got {type(module).__name__}")
    found = list(module.named_parameters(remove_duplicate=False))
    for name, t in module.named_buffers(remove_duplicate=False):
        path, _, attr = name.rpartition(".")
        owner = module.get_submodule(path) if path else module
        if attr not in owner._non_persistent_buffers_set:
            found.append((name, t))
    out, names = [], set()
    for name, t in found:
        if type(t).__name__ == "FlatParameter" or name.rpartition(".")[2] == "_flat_param":
            raise ValueError(
                f"module: {name!r} is an FSDP1 flat parameter (FullyShardedDataParallel flattens and shards the "
                "parameters into one); use FSDP2 (torch.distributed.fsdp.fully_shard), or call init_module_ before "
                "wrapping (FSDP's param_init_fn)"
            )
        clean = strip_wrappers(name)
        if clean in names:
            raise ValueError(f"module: two tensors are named {clean!r} once wrappers are removed")
        names.add(clean)
        out.append((clean, name, t))
    return out


def quantized_class(t) -> str | None:
    """The class of a tensor that keeps quantized bytes under the dtype it reports (Transformer
    Engine's ``Float8Tensor``, ``MXFP8Tensor``, ...: FP8 or FP4 primary weights, which its
    ``fp8_model_init`` and Megatron's ``fp8_param`` make), else None. Such a tensor's storage is
    not ``t.dtype``'s: no bytes of that dtype can be written into it."""
    if any(c.__module__.startswith("transformer_engine") for c in type(t).__mro__):
        return type(t).__name__
    return None


def dtype_name(t) -> str | None:
    """``t``'s dtype as the engine names it (``float32``, ``bfloat16``, ``float16``), else None."""
    name = str(t.dtype).removeprefix("torch.")
    return name if name in TORCH_DTYPES else None
