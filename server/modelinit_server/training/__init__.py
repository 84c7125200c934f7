"""In the training process: fill an already-materialized ``torch.nn.Module`` in place with exactly
the bytes ``modelinit init`` writes for the same model, seed and policy (docs/training.md).

    model = build_on_meta(); parallelize(model); model.to_empty(device="cuda")
    summary = modelinit.init_module_(model, seed=42)          # hf-default, or policy=...

* A transformers model is resolved from ``module.config`` and its class, exactly as a request
  with that config and class is (so ``modelinit init`` of the same config writes the same bytes);
  any other module becomes a spec of its own parameters (kinds, roles, fans from module types),
  and the policy's rules must match every parameter.
* Every stored tensor's element ``i`` is a pure function of ``(key, i)`` (docs/determinism.md),
  so each tensor is produced piecewise: a DTensor parameter (FSDP2, tensor parallel, any mesh,
  ``Shard``/``_StridedShard``/``Replicate``, uneven shards) is filled rank by rank, each rank
  generating only the elements it holds, with no communication at all.
* In-memory parameters that transformers fuses (MoE ``experts.gate_up_proj`` [E, 2I, H]) are
  filled with the bytes of the per-expert tensors the files hold (``experts.M.w1.weight`` ...),
  each at the place transformers' own conversion reads it from.

The package, top to bottom (pyproject.toml's ``server-training-layers`` contract):

    init         init_module_: the policy, a model or its parts
    job          one model's fill: checked and planned (``core.planner.resolve_request``), then written
    summary      InitSummary, what init_module_ reports
    registry     the stacks init_module_ asks, in order (a new stack: its module and one line there)
    hf_layout    a transformers model's spec, and where each stored tensor sits in its in-memory tensors
    torchtitan_layout   where the tensors of a torchtitan model's Hugging Face spec sit in its parameters
    megatron/           where they sit in a Megatron-Core model's local parameters (its sharded_state_dict), and
                        the Hugging Face config its own TransformerConfig derives (no spec given)
    plain        any other module's spec, from its own tensors
    stack        Stack, the interface each of the four implements, StackBase, and Layout, what it returns
    torchtitan_config   the Hugging Face config a torchtitan model's own configuration derives (no spec given)
    placement    a stored tensor's place in an in-memory one, read off probes (views, index probes)
    fill         Box / Piece, and Filler: boxes of stored tensors into (local shards of) module tensors
    dtensor      a DTensor's local shard and the global indices it holds (dtensor_index_sets)
    modules      unwrapping wrappers, refusing sharded FSDP1, the module's named tensors, dtype names

May import the server layers below it (messages, architectures, core, engine), never the service.
"""
from __future__ import annotations

from .dtensor import dtensor_index_sets
from .init import init_module_
from .job import spec_of
from .modules import strip_wrappers, unwrap
from .summary import InitSummary

__all__ = ["InitSummary", "dtensor_index_sets", "init_module_", "spec_of", "strip_wrappers", "unwrap"]
