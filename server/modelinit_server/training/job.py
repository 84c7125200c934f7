"""One model's fill, checked and planned before any tensor is written (:func:`prepare`), then
written (:func:`fill`): the stack that recognizes it, the spec, the layout, each dtype's plan, and
the loop over its tensors."""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

from ..core.planner import Request, resolve_request
from ..core.policies import Policy, Resolved
from ..core.tensors import ModelSpec
from . import registry
from .dtensor import local_and_index_sets, local_tensor
from .fill import Filler
from .modules import TORCH_DTYPES, dtype_name, module_tensors, quantized_class, refuse_sharded_fsdp1, unwrap
from .summary import InitSummary


def model_parts(module) -> list | None:
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
class Job:
    """One model's fill, checked and planned, nothing written yet (:func:`prepare`)."""

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
class Shared:
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


def prepare(module, seed: int, core_policy: Policy, dtype: str | None, version: int, partial: bool,
             spec: Any, shared: Shared) -> Job:
    """Everything :func:`~modelinit_server.training.init_module_` checks and plans for one model, before any tensor is written
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
        quantized = quantized_class(local_tensor(t))
        if quantized is not None:
            raise ValueError(f"module: {name!r} is Transformer Engine's {quantized}, whose bytes are not the {t.dtype} "
                             "it reports (FP8/FP4 primary weights: fp8_model_init, Megatron's fp8_param); build the "
                             f"model with its weights in {str(t.dtype).removeprefix('torch.')} (FP8 compute still "
                             "applies) to fill it")
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
    return Job(layout.spec, named, layout, plans, dtypes, skipped, stack_buffers, derived, version)


def fill(job: Job, device: str) -> InitSummary:
    """Write every tensor of a prepared model: each rank only the elements it holds."""
    import torch

    layout, model_spec, pieces = job.layout, job.spec, job.layout.pieces
    filler = Filler(device, elements=sum(local_tensor(t).numel() for _, t in job.named if local_tensor(t).device.type == "cpu"))
    seen: set[int] = set()
    count = elements = total = 0
    with torch.no_grad():
        for name, t in job.named:
            if id(t) in seen:
                continue
            seen.add(id(t))
            dt = dtype_name(t)
            resolved, keys, _ = job.plans[dt]
            placed = layout.placed.get(name)
            if placed is not None:  # the stack says where the local elements sit, run by run
                whole, local = placed.whole, local_tensor(t)
                targets = [(_run_view(local, run), run.sets) for run in placed.runs]
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
    fp = fingerprint({dt: job.plans[dt][2] for dt in job.dtypes})
    return InitSummary(count, elements, total, fp, job.version, tuple(job.dtypes),
                       model_spec.architecture, job.skipped, layout.missing, job.stack_buffers, job.derived)


def _run_view(local, run):
    """The local elements of ``run`` as a tensor of its shape (the tensor itself when the run is all
    of it, as it is shaped)."""
    if run.first == 0 and run.end == local.numel() and tuple(run.shape) == tuple(local.shape):
        return local
    return local.view(-1)[run.first:run.end].view(run.shape)


def fingerprint(by_dtype: dict[str, str]) -> str:
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
