"""``init_module_``: fill a materialized (or sharded) module, or the parts of one model, in place."""
from __future__ import annotations

from typing import Any

from modelinit_wire import releases

from ..core.policies import Policy
from ..engine import ALGORITHM_VERSION
from .job import Shared, fill, fingerprint, model_parts, prepare
from .modules import TORCH_DTYPES
from .summary import InitSummary


def init_module_(module, *, seed: int, policy: Any = None, dtype: str | None = None,
                 algorithm_version: int | None = None, device: str = "auto", partial: bool = False,
                 spec: Any = None) -> InitSummary:
    """Fill every parameter and persistent floating-point buffer of ``module`` in place.

    ``module``: the model, or a list of model parts (torchtitan's ``model_parts``: the pipeline
    stages on this rank, as a looped or V schedule places several; a list, a tuple, or a
    ``ModuleList`` of a training stack's or transformers' models), each filled with the whole
    model's bytes as its own call would fill it; nothing is written unless every part can be.
    ``policy``: None (``hf-default``), a preset name, a policy dict (``{"preset": ..., "rules":
    [...]}``), a path to a policy file, a ``modelinit.Policy`` message or a core ``Policy``.
    ``dtype``: optional check that every tensor has this dtype (the bytes always follow each
    tensor's own dtype, as ``modelinit init --dtype`` of that dtype writes them).
    ``device``: the engine for CPU tensors, ``auto``/``cpu`` (numba) or ``reference`` (numpy);
    tensors on a CUDA device are filled on it by the Triton kernel.
    ``partial``: the module (or the parts together) is part of a model (a pipeline stage: some
    layers, the embedding or the head left out, the others under their original names); the
    tensors it has are filled, those it lacks are counted in ``summary.missing`` instead of refused.
    ``spec``: for a model of a training stack with its own module tree (torchtitan, Megatron-Core),
    the Hugging Face config it corresponds to (a preset name, a config.json path, or the config as
    a dict): the model is filled with exactly the bytes of the folder ``modelinit init`` writes for
    it. Left out, the stack derives it from the model's own configuration where it can
    (torchtitan's Llama 3, Qwen3, DeepSeek-V3; Megatron-Core's Llama, Qwen2/3, StarCoder2,
    Qwen3-MoE, Mixtral, Qwen2-MoE, GLM-4-MoE, DeepSeek-V3-style MLA: ``summary.derived_config``)
    and refuses naming the field it cannot.
    Raises ValueError for a module on the meta device, an unmatched parameter, a dtype mismatch,
    or a tensor the architecture does not have.
    """
    low = releases.below("torch", "numpy")
    if low is not None:
        raise ValueError(f"module: {low}")
    version = ALGORITHM_VERSION if algorithm_version in (None, 0) else algorithm_version
    if dtype is not None and dtype not in TORCH_DTYPES:
        raise ValueError(f"dtype: {dtype!r} is not one of {', '.join(TORCH_DTYPES)}")
    core_policy = policy_of(policy)
    parts = model_parts(module)
    if parts is None:
        return fill(prepare(module, seed, core_policy, dtype, version, partial, spec, Shared()), device)
    shared = Shared()
    jobs = [prepare(part, seed, core_policy, dtype, version, partial, spec, shared) for part in parts]
    for i, job in enumerate(jobs[1:], 1):
        if job.spec.tensors != jobs[0].spec.tensors:
            raise ValueError(f"module: model part {i} ({job.spec.architecture}) is not a part of the same model as part 0 "
                             f"({jobs[0].spec.architecture}); fill the parts of one model per call")
    held = {ti for job in jobs for name, _ in job.named for ti, *_ in job.layout.pieces.get(name, ())}
    lacking = sum(1 for i in range(len(jobs[0].spec.tensors)) if i not in held)
    summaries = tuple(fill(job, device) for job in jobs)
    fps = {dt: job.plans[dt][2] for job in jobs for dt in job.dtypes}
    return InitSummary(sum(s.tensors for s in summaries), sum(s.elements for s in summaries),
                       sum(s.global_elements for s in summaries), fingerprint(fps), version, tuple(sorted(fps)),
                       summaries[0].architecture, tuple(n for s in summaries for n in s.skipped), lacking,
                       tuple(n for s in summaries for n in s.stack_buffers), summaries[0].derived_config, summaries)


def policy_of(policy: Any) -> Policy:
    """The core Policy of what callers give: a core Policy, or anything ``policy_file.from_arg``
    takes (None for hf-default, a preset name, a policy dict, a file path, the message)."""
    if isinstance(policy, Policy):
        return policy
    if policy is None:
        return Policy()  # hf-default, without importing the policy text format
    from modelinit_wire import policy_file

    from ..messages import policy_from_pb

    return policy_from_pb(policy_file.from_arg(policy))
