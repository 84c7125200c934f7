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

    __init__     init_module_ and InitSummary: the policy, the plan (``core.planner.resolve_request``), the loop
    registry     the stacks init_module_ asks, in order (a new stack: its module and one line there)
    hf_layout    a transformers model's spec, and where each stored tensor sits in its in-memory tensors
    torchtitan_layout   where the tensors of a torchtitan model's Hugging Face spec sit in its parameters
    megatron/           where they sit in a Megatron-Core model's local parameters (its sharded_state_dict), and
                        the Hugging Face config its own TransformerConfig derives (no spec given)
    plain        any other module's spec, from its own tensors
    stack        Stack, the interface each of the four implements, and Layout, what it returns
    torchtitan_config   the Hugging Face config a torchtitan model's own configuration derives (no spec given)
    placement    a stored tensor's place in an in-memory one, read off probes (views, index probes)
    fill         Box / Piece, and Filler: boxes of stored tensors into (local shards of) module tensors
    dtensor      a DTensor's local shard and the global indices it holds (dtensor_index_sets)
    modules      unwrapping wrappers, refusing sharded FSDP1, the module's named tensors, dtype names

May import the server layers below it (messages, architectures, core, engine), never the service.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

from ..core.planner import Request, resolve_request
from ..core.tensors import ModelSpec
from ..core.policies import Policy, Resolved
from ..engine import ALGORITHM_VERSION
from .dtensor import dtensor_index_sets, local_and_index_sets, local_tensor
from .fill import Filler
from .modules import TORCH_DTYPES, dtype_name, module_tensors, refuse_sharded_fsdp1, strip_wrappers, unwrap
from . import registry

__all__ = ["InitSummary", "dtensor_index_sets", "init_module_", "strip_wrappers", "unwrap"]


@dataclass(frozen=True)
class InitSummary:
    """What :func:`init_module_` did."""

    tensors: int
    """Distinct module tensors filled on this rank (tied parameters count once)."""
    elements: int
    """Elements written on this rank (a rank of a sharded model writes only its shards)."""
    global_elements: int
    """Elements of the filled tensors as the whole model holds them."""
    fingerprint: str
    """The plan's fingerprint: the ``fingerprint`` of ``modelinit.json`` for the same model, seed,
    policy and dtype (when the module mixes dtypes: a SHA-256 over ``dtype:fingerprint`` pairs)."""
    algorithm_version: int
    dtypes: tuple[str, ...]
    """The dtypes the tensors were generated in (each tensor in its own dtype)."""
    architecture: str
    """The transformers class the spec came from, or the module's class name."""
    skipped: tuple[str, ...] = ()
    """Persistent buffers left as they are (not floating point: counters, masks)."""
    missing: int = 0
    """Stored tensors of the architecture this module does not hold (``partial=True``: a pipeline
    stage's other stages hold them)."""
    stack_buffers: tuple[str, ...] = ()
    """Persistent buffers a training stack's own code initialized, which are not weights and draw
    nothing (torchtitan: an MoE's load-balancing bias); its non-persistent ones (RoPE tables, token
    counters) were initialized the same way."""
    derived_config: dict[str, Any] | None = None
    """The Hugging Face config document derived from a training stack's own model configuration
    when no ``spec`` was given (write it to a config.json and ``modelinit init`` it for the same
    bytes in a folder); None when ``spec`` was given or the model carries its own."""
    parts: tuple["InitSummary", ...] = ()
    """Each model part's own summary, in order, when a list of parts was filled (the fields above
    are then their sums and unions; ``missing`` counts the stored tensors no part holds)."""


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
    version = ALGORITHM_VERSION if algorithm_version in (None, 0) else algorithm_version
    if dtype is not None and dtype not in TORCH_DTYPES:
        raise ValueError(f"dtype: {dtype!r} is not one of {', '.join(TORCH_DTYPES)}")
    core_policy = _core_policy(policy)
    parts = _model_parts(module)
    if parts is None:
        return _fill(_prepare(module, seed, core_policy, dtype, version, partial, spec, _Shared()), device)
    shared = _Shared()
    jobs = [_prepare(part, seed, core_policy, dtype, version, partial, spec, shared) for part in parts]
    for i, job in enumerate(jobs[1:], 1):
        if job.spec.tensors != jobs[0].spec.tensors:
            raise ValueError(f"module: model part {i} ({job.spec.architecture}) is not a part of the same model as part 0 "
                             f"({jobs[0].spec.architecture}); fill the parts of one model per call")
    held = {ti for job in jobs for name, _ in job.named for ti, *_ in job.layout.pieces.get(name, ())}
    lacking = sum(1 for i in range(len(jobs[0].spec.tensors)) if i not in held)
    summaries = tuple(_fill(job, device) for job in jobs)
    fps = {dt: job.plans[dt][2] for job in jobs for dt in job.dtypes}
    return InitSummary(sum(s.tensors for s in summaries), sum(s.elements for s in summaries),
                       sum(s.global_elements for s in summaries), _fingerprint(fps), version, tuple(sorted(fps)),
                       summaries[0].architecture, tuple(n for s in summaries for n in s.skipped), lacking,
                       tuple(n for s in summaries for n in s.stack_buffers), summaries[0].derived_config, summaries)


def _model_parts(module) -> list | None:
    """The model parts ``module`` lists (a list, a tuple, or a ``ModuleList`` whose members are
    models of a stack that takes a spec or transformers models), or None for one model."""
    import torch

    if isinstance(module, (list, tuple)):
        if not module:
            raise ValueError("module: an empty list of model parts; give the model, or this rank's pipeline stages")
        return list(module)
    if isinstance(module, torch.nn.ModuleList) and len(module) and \
            all(registry.stack_of(unwrap(m)).name != "plain" for m in module):
        return list(module)
    return None


@dataclass
class _Job:
    """One model's fill, checked and planned, nothing written yet (:func:`_prepare`)."""

    spec: ModelSpec
    named: list[tuple[str, Any]]
    layout: Any
    plans: dict[str, tuple[list[Resolved], list[tuple[int, int]], str]]
    dtypes: list[str]
    skipped: tuple[str, ...]
    stack_buffers: tuple[str, ...]
    derived: dict[str, Any] | None
    version: int


@dataclass
class _Shared:
    """What the parts of one call share, worked out for the first part only: the spec given, read
    (a preset builds a transformers model on the meta device), and each dtype's plan of a model's
    spec (the policy resolved over every tensor: seconds for a large model)."""

    given: list[tuple[Any, ModelSpec]] = field(default_factory=list)
    """``(spec, spec_of(spec))`` of the specs read: the argument, or the config each part derives
    (equal dicts, one per part)."""
    spec: ModelSpec | None = None
    """The spec the plans below are of; a part of another spec plans for itself."""
    plans: dict[str, tuple[list[Resolved], list[tuple[int, int]], str]] = field(default_factory=dict)

    def read(self, spec: Any) -> ModelSpec:
        for arg, model in self.given:
            if arg is spec or (type(arg) is type(spec) and arg == spec):
                return model
        model = spec_of(spec)
        self.given.append((spec, model))
        return model

    def plan(self, request: Request) -> tuple[list[Resolved], list[tuple[int, int]], str]:
        if self.spec is None:
            self.spec = request.model
        elif self.spec is not request.model and self.spec != request.model:
            return resolve_request(request)
        if request.dtype not in self.plans:
            self.plans[request.dtype] = resolve_request(request)
        return self.plans[request.dtype]


def _prepare(module, seed: int, core_policy: Policy, dtype: str | None, version: int, partial: bool,
             spec: Any, shared: _Shared) -> _Job:
    """Everything :func:`init_module_` checks and plans for one model, before any tensor is written
    (the stack's own buffers, which draw nothing, are set here). ``shared``: what an earlier part
    of the same call worked out already."""
    refuse_sharded_fsdp1(module)
    module = unwrap(module)
    stack = registry.stack_of(module)
    derived = stack.own_config(module) if stack.takes_spec and spec is None else None
    spec = derived if derived is not None else spec
    if stack.takes_spec and spec is None:
        raise ValueError(f"spec: a {stack.name} model is filled with the bytes of the Hugging "
                         "Face model it corresponds to; give its config: init_module_(model, spec='llama-3-8b' (a preset), "
                         "a config.json path or a dict, ...)")
    stack_buffers = stack.prepare(module)
    named = module_tensors(module)
    if not named:
        raise ValueError("module: it has no parameters or persistent buffers to fill")

    skipped = tuple(n for n, _, t in named if not t.is_floating_point())
    real = {n: r for n, r, _ in named}
    named = [(n, t) for n, _, t in named if t.is_floating_point()]
    for name, t in named:
        if local_tensor(t).device.type == "meta" or t.device.type == "meta":
            raise ValueError(
                f"module: {name!r} is on the meta device; materialize first with module.to_empty(device=...)"
            )
        td = dtype_name(t)
        if td is None:
            raise ValueError(f"module: {name!r} is {t.dtype}; modelinit generates {', '.join(TORCH_DTYPES)}")
        if dtype is not None and td != dtype:
            raise ValueError(f"dtype: {name!r} is {td}, not {dtype}; cast the module or leave dtype unset")

    if spec is not None and not stack.takes_spec:
        mapped = ", ".join(s.name for s in registry.STACKS if s.takes_spec)
        raise ValueError(f"spec: {type(module).__name__} is not a model of a training stack modelinit maps ({mapped}); "
                         "a transformers model carries its own config, any other module is its own spec: leave spec unset")
    given = shared.read(spec) if stack.takes_spec else None
    try:
        layout = stack.layout(module, given, named, real, partial)
    except ValueError as e:
        differences = _differences(stack, module, given) if derived is None else ""
        if not differences:
            raise
        raise ValueError(f"{e}; {differences}") from None
    named = [(n, t) for n, t in named if n not in layout.own_state]  # set by stack.prepare already
    stack_buffers = tuple(n for n in stack_buffers if not layout.pieces.get(n))

    dtypes = sorted({dtype_name(t) for _, t in named})
    plans = {}
    for dt in dtypes:  # each tensor in its own dtype: the plan of a request for that dtype
        request = Request(model=layout.spec, policy=core_policy, seed=seed, dtype=dt, algorithm_version=version)
        plans[dt] = shared.plan(request)
    return _Job(layout.spec, named, layout, plans, dtypes, skipped, stack_buffers, derived, version)


def _fill(job: _Job, device: str) -> InitSummary:
    """Write every tensor of a prepared model: each rank only the elements it holds."""
    import torch

    layout, model_spec, pieces = job.layout, job.spec, job.layout.pieces
    filler = Filler(device)
    seen: set[int] = set()
    count = elements = total = 0
    with torch.no_grad():
        for name, t in job.named:
            if id(t) in seen:
                continue
            seen.add(id(t))
            dt = dtype_name(t)
            resolved, keys, _ = job.plans[dt]
            if name in layout.runs:  # FSDP2's shard of a fused GroupedMLP weight, run by run
                whole, local = layout.index_sets[name][0], local_tensor(t)
                targets = [(local.view(-1)[first:end].view(shape), sets)
                           for first, end, shape, sets in layout.runs[name]]
            elif name in layout.index_sets:
                (whole, sets), local = layout.index_sets[name], local_tensor(t).view(layout.views[name]) \
                    if name in layout.views else local_tensor(t)  # FSDP2's shard of Megatron's tensor-parallel parameter
                targets = [(local, sets)]
            else:
                (local, sets), whole = local_and_index_sets(t, name), t.shape
                targets = [(local, sets)]
            for ti, *box in pieces[name]:
                if box[2] and box[2][0] >= model_spec.tensors[ti].shape[0] and resolved[ti].sampler.kind == "computed":
                    raise ValueError(f"module: {name!r} has rows past {model_spec.tensors[ti].name!r}'s end (a padded "
                                     "vocabulary), whose values are computed, not drawn: pad the vocabulary to the spec's")
                for target, sets in targets:
                    filler.fill_piece(target, sets, model_spec.tensors[ti], resolved[ti].sampler, keys[ti], dt, *box)
            count += 1
            elements += local.numel()
            total += math.prod(whole)
    fp = _fingerprint({dt: job.plans[dt][2] for dt in job.dtypes})
    return InitSummary(count, elements, total, fp, job.version, tuple(job.dtypes),
                       model_spec.architecture, job.skipped, layout.missing, job.stack_buffers, job.derived)


def _fingerprint(by_dtype: dict[str, str]) -> str:
    """The plan's fingerprint; a module that mixes dtypes: a SHA-256 over ``dtype:fingerprint`` pairs."""
    if len(by_dtype) == 1:
        return next(iter(by_dtype.values()))
    return hashlib.sha256(",".join(f"{d}:{by_dtype[d]}" for d in sorted(by_dtype)).encode()).hexdigest()


def spec_of(spec: Any) -> ModelSpec:
    """The architecture spec of what a caller gives: a core ModelSpec, or what
    ``modelinit_wire.spec_argument`` reads (a preset name, a path to a config.json or a folder
    holding one, a config dict), by the rule the client follows too."""
    from modelinit_wire.spec_argument import Preset, read_spec_argument

    from .. import architectures

    if isinstance(spec, ModelSpec):
        return spec
    named = read_spec_argument(spec)
    if isinstance(named, Preset):
        return architectures.from_preset(named.name)
    return architectures.from_config(named.document)



#: Keys of the configs the stacks derive that decide no tensor and no value (RoPE tables are no
#: weights; eps is the forward pass's): a difference in them is not why a model does not match.
_NO_TENSOR_KEYS = frozenset({"architectures", "torch_dtype", "max_position_embeddings", "rope_theta", "rope_scaling",
                             "rms_norm_eps", "layer_norm_eps", "use_cache", "transformers_version"})


def _differences(stack: Any, module: Any, given: ModelSpec | None) -> str:
    """When a model does not match the spec given for it: the config keys whose values differ
    between that spec and the config the stack derives from the model's own (a layer count, a
    size, tying), with both values; empty when the stack derives none or they agree."""
    if given is None:
        return ""
    try:
        own = stack.own_config(module)
    except ValueError:  # a model with a field no Hugging Face config has: the layout's error stands
        return ""
    if not own:
        return ""
    keys = [k for k in own if k in given.config and given.config[k] != own[k] and k not in _NO_TENSOR_KEYS]
    if not keys:
        return ""
    listed = ", ".join(f"{k}: {given.config[k]!r} in the spec, {own[k]!r} in the model" for k in keys[:6])
    return f"the spec differs from the model's own config in {listed}" + (" ..." if len(keys) > 6 else "")

def _core_policy(policy: Any) -> Policy:
    """The core Policy of what callers give: a core Policy, or anything ``policy_file.from_arg``
    takes (None for hf-default, a preset name, a policy dict, a file path, the message)."""
    if isinstance(policy, Policy):
        return policy
    if policy is None:
        return Policy()  # hf-default, without importing the policy text format
    from modelinit_wire import policy_file

    from ..messages import policy_from_pb

    return policy_from_pb(policy_file.from_arg(policy))
