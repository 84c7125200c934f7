"""In the training process: fill an already-materialized ``torch.nn.Module`` in place with exactly
the bytes ``modelinit init`` writes for the same model, seed and policy (DESIGN.md §8b).

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

How a local shard's global elements are found: a DTensor's local tensor is always the Cartesian
product of one sorted list of global indices per tensor dimension (each placement shards one
dimension, and how it splits depends only on that dimension's size). Those lists are computed by
applying each placement's own split to an ``arange`` of the dimension, in mesh order, exactly as
torch's ``_StridedShard.local_shard_size_and_offset`` does; the engine then generates the runs of
consecutive global flat indices they contain, straight into the local tensor when its layout
allows, else into a buffer that is scattered once.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.planner import Request, fingerprint, tensor_keys
from ..core.policies import Policy, Resolved, resolve
from ..core.tensors import ModelSpec, TensorSpec
from ..engine import ALGORITHM_VERSION, DTYPE_ITEMSIZE, check_dtype
from ..engine.runs import box_runs

__all__ = ["InitSummary", "init_module_", "strip_wrappers", "unwrap"]

#: Module-name components that wrappers insert and that the canonical names never contain:
#: torch.compile, activation checkpointing, FSDP1.
WRAPPER_COMPONENTS = ("_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module")

#: The probe that locates a fused parameter's pieces holds one int64 per element; refuse beyond this.
MAX_PROBE_ELEMENTS = 2**28

_TORCH_DTYPES = ("float32", "bfloat16", "float16")


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


# --- public entry point -----------------------------------------------------------------------


def init_module_(module, *, seed: int, policy: Any = None, dtype: str | None = None,
                 algorithm_version: int | None = None, device: str = "auto", partial: bool = False) -> InitSummary:
    """Fill every parameter and persistent floating-point buffer of ``module`` in place.

    ``policy``: None (``hf-default``), a preset name, a policy dict (``{"preset": ..., "rules":
    [...]}``), a path to a policy file, a ``modelinit.Policy`` message or a core ``Policy``.
    ``dtype``: optional check that every tensor has this dtype (the bytes always follow each
    tensor's own dtype, as ``modelinit init --dtype`` of that dtype writes them).
    ``device``: the engine for CPU tensors, ``auto``/``cpu`` (numba) or ``reference`` (numpy);
    tensors on a CUDA device are filled on it by the Triton kernel.
    ``partial``: the module is part of a transformers model (a pipeline stage: some layers, the
    embedding or the head left out, the others under their original names); the tensors it
    has are filled, those it lacks are counted in ``summary.missing`` instead of refused.
    Raises ValueError for a module on the meta device, an unmatched parameter, a dtype mismatch,
    or a tensor the architecture does not have.
    """
    import torch

    version = ALGORITHM_VERSION if algorithm_version in (None, 0) else algorithm_version
    if dtype is not None and dtype not in _TORCH_DTYPES:
        raise ValueError(f"dtype: {dtype!r} is not one of {', '.join(_TORCH_DTYPES)}")
    _refuse_sharded_fsdp1(module)
    module = unwrap(module)
    named = _module_tensors(module)
    if not named:
        raise ValueError("module: it has no parameters or persistent buffers to fill")
    core_policy = _core_policy(policy)

    skipped = tuple(n for n, _, t in named if not t.is_floating_point())
    real = {n: r for n, r, _ in named}
    named = [(n, t) for n, _, t in named if t.is_floating_point()]
    for name, t in named:
        if _local(t).device.type == "meta" or t.device.type == "meta":
            raise ValueError(
                f"module: {name!r} is on the meta device; materialize first with module.to_empty(device=...)"
            )
        td = _dtype_name(t)
        if td is None:
            raise ValueError(f"module: {name!r} is {t.dtype}; modelinit generates {', '.join(_TORCH_DTYPES)}")
        if dtype is not None and td != dtype:
            raise ValueError(f"dtype: {name!r} is {td}, not {dtype}; cast the module or leave dtype unset")

    hf = _hf_model(module)
    if hf is not None:
        spec, pieces, missing = _hf_spec(hf, {n: tuple(t.shape) for n, t in named}, partial)
    else:
        missing = 0
        spec, pieces = _plain_spec(module, named, real)

    dtypes = sorted({_dtype_name(t) for _, t in named})
    plans: dict[str, tuple[list[Resolved], list[tuple[int, int]], str]] = {}
    for dt in dtypes:
        request = Request(model=spec, policy=core_policy, seed=seed, dtype=dt, algorithm_version=version)
        resolved = resolve(core_policy, spec)
        for t, r in zip(spec.tensors, resolved):
            try:
                check_dtype(r.sampler, dt)
            except ValueError as e:
                raise ValueError(f"dtype: {dt} cannot hold {t.name!r} ({r.init}): {e}") from None
        plans[dt] = (resolved, tensor_keys(request), fingerprint(request, resolved))

    filler = _Filler(device)
    seen: set[int] = set()
    count = elements = total = 0
    with torch.no_grad():
        for name, t in named:
            if id(t) in seen:
                continue
            seen.add(id(t))
            dt = _dtype_name(t)
            resolved, keys, _ = plans[dt]
            local, sets = _local_and_index_sets(t, name)
            for ti, *box in pieces[name]:
                filler.fill_piece(local, sets, spec.tensors[ti], resolved[ti].sampler, keys[ti], dt, *box)
            count += 1
            elements += local.numel()
            total += t.numel()
    if len(dtypes) == 1:
        fp = plans[dtypes[0]][2]
    else:
        fp = hashlib.sha256(",".join(f"{d}:{plans[d][2]}" for d in dtypes).encode()).hexdigest()
    return InitSummary(count, elements, total, fp, version, tuple(dtypes), spec.architecture, skipped, missing)


# --- the module's tensors -----------------------------------------------------------------------


#: Wrappers around a whole model, and the attribute that holds the model: DDP, FSDP1, torch.compile,
#: activation checkpointing (by class name: none of them needs importing to be recognized).
ROOT_WRAPPERS = {"DistributedDataParallel": "module", "FullyShardedDataParallel": "_fsdp_wrapped_module",
                 "OptimizedModule": "_orig_mod", "CheckpointWrapper": "_checkpoint_wrapped_module",
                 "OffloadWrapper": "_checkpoint_wrapped_module"}


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


def _refuse_sharded_fsdp1(module) -> None:
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


def _module_tensors(module) -> list[tuple[str, str, Any]]:
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


def _is_dtensor(t) -> bool:
    DTensor = _dtensor_class()
    return DTensor is not None and isinstance(t, DTensor)


def _dtensor_class():
    try:
        from torch.distributed.tensor import DTensor
    except Exception:  # noqa: BLE001 - torch without distributed
        return None
    return DTensor


def _local(t):
    return t._local_tensor if _is_dtensor(t) else t


def _dtype_name(t) -> str | None:
    name = str(t.dtype).removeprefix("torch.")
    return name if name in _TORCH_DTYPES else None


def _local_and_index_sets(t, name: str):
    """The tensor to write into and, per dimension, the global indices it holds (None: all)."""
    if not _is_dtensor(t):
        return t.data if hasattr(t, "data") else t, [None] * t.dim()
    local = t._local_tensor
    sets = dtensor_index_sets(t)
    want = tuple(len(s) if s is not None else n for s, n in zip(sets, t.shape))
    if tuple(local.shape) != want:
        raise ValueError(
            f"module: {name!r}: its local shard is {tuple(local.shape)} but its placements {tuple(t.placements)} "
            f"give {want}; this sharding is not supported"
        )
    return local, sets


def dtensor_index_sets(t) -> list[np.ndarray | None]:
    """Per dimension of DTensor ``t``, the sorted global indices its local shard holds (None: the
    whole dimension). Placements are applied in mesh order, each with its own split (torch's
    ``Shard``/``_StridedShard`` semantics, uneven sizes included), to an arange of the dimension:
    no communication."""
    import torch
    from torch.distributed.tensor.placement_types import Shard, _StridedShard

    mesh = t.device_mesh
    coord = mesh.get_coordinate()
    ndim = t.dim()
    sets: list[np.ndarray | None] = [None] * ndim
    if coord is None:  # not part of the mesh: holds nothing
        return [np.zeros(0, dtype=np.int64)] * ndim
    for i, p in enumerate(t.placements):
        if p.is_replicate():
            continue
        if not isinstance(p, (Shard, _StridedShard)):
            raise ValueError(f"module: placement {p} of a parameter is not supported (Shard, _StridedShard, Replicate)")
        d = p.dim % ndim
        cur = torch.arange(t.shape[d]) if sets[d] is None else torch.from_numpy(sets[d])
        parts, _ = p._split_tensor(cur.view([1] * d + [-1]), mesh.size(i), with_padding=False, contiguous=False)
        sets[d] = parts[coord[i]].reshape(-1).numpy().astype(np.int64, copy=True)
    return sets


# --- specs ---------------------------------------------------------------------------------------

#: Where a stored tensor's elements sit in an in-memory tensor: a box of one in the other.
#: (start per in-memory dim, in-memory dim of each disk dim or -1 for a unit one, start per disk
#: dim, length per disk dim)
Box = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]
#: (index into spec.tensors, *Box)
Piece = tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def _hf_model(module):
    """The transformers model behind ``module`` (unwrapping torch.compile), or None."""
    tf = sys.modules.get("transformers")
    if tf is None:
        return None
    inner = getattr(module, "_orig_mod", module)
    try:
        base = tf.PreTrainedModel
    except Exception:  # noqa: BLE001
        return None
    return inner if isinstance(inner, base) else None


def _hf_class(model):
    """The transformers class of ``model`` (FSDP2 swaps in a subclass named ``FSDP<Class>``)."""
    import transformers as tf

    for cls in type(model).__mro__:
        try:
            if getattr(tf, cls.__name__, None) is cls:
                return cls
        except Exception:  # noqa: BLE001 - a lazily imported class whose module needs something missing
            continue
    raise ValueError(f"module: {type(model).__name__} is not a transformers model class")


def _hf_spec(model, shapes: dict[str, tuple[int, ...]],
             partial: bool = False) -> tuple[ModelSpec, dict[str, list[Piece]], int]:
    """The spec of a transformers model, and where each of its tensors (``shapes``: name -> the
    global shape the module holds) gets its bytes from."""
    from .. import architectures
    from ..architectures import hf
    from ..architectures._fields import DROPPED_KEYS

    cls = _hf_class(model)
    document = {k: v for k, v in model.config.to_dict().items() if k not in DROPPED_KEYS}
    document["architectures"] = [cls.__name__]
    spec = architectures.from_config(document, cls.__name__)
    index = {t.name: i for i, t in enumerate(spec.tensors)}
    tf = hf._transformers()
    config = hf._config(tf, document)
    meta = hf._meta_model(tf, cls, config)
    with hf._quiet():
        meta.tie_weights()
    layout = _disk_sources(tf, meta)  # disk name -> [(in-memory name, Box)]
    by_source: dict[str, list[Piece]] = {}
    for disk, parts in layout.items():
        if disk in index:
            for src, box in parts:
                by_source.setdefault(src, []).append((index[disk], *box))
    pieces: dict[str, list[Piece]] = {}
    known = {name: tuple(t.shape) for name, t in meta.state_dict().items()}
    names = list(shapes)
    for name in names:
        target = spec.tied.get(name, name)
        if name not in known:
            raise ValueError(
                f"module: {name!r} is not a tensor of {cls.__name__} built from its config "
                f"(the architecture has e.g. {sorted(known)[:3]}); modules changed after construction are not supported"
            )
        if shapes[name] != known[name]:
            raise ValueError(
                f"module: {name!r} has shape {list(shapes[name])}, but {cls.__name__} built from its config has "
                f"{list(known[name])}: a resized or flattened parameter (FSDP1 with use_orig_params holds flat "
                "pieces: use FSDP2, whose DTensors keep the global shape)"
            )
        if target not in by_source:
            raise ValueError(f"module: {name!r} of {cls.__name__} is not stored by save_pretrained; modelinit has no bytes for it")
        pieces[name] = by_source[target]
    covered = {p[0] for name in names for p in pieces[name]}
    missing = [t.name for i, t in enumerate(spec.tensors) if i not in covered]
    if missing and not partial:
        raise ValueError(f"module: the model lacks tensors the architecture stores, e.g. {missing[:3]}; for a "
                         "pipeline stage (a part of the model under its original names) pass partial=True")
    return spec, pieces, len(missing)


def _disk_sources(tf, model) -> dict[str, list[tuple[str, Box]]]:
    """For every disk tensor save_pretrained would write from ``model``'s state_dict: the in-memory
    tensors it is made of and where (one, unless a conversion concatenates several: Nomic-BERT's
    ``attn.Wqkv`` of ``q_proj``, ``k_proj``, ``v_proj``). Mirrors
    ``architectures.hf._reverse_conversion``: transformers' own converters run on probes of the
    in-memory tensors, and where each output's elements come from is read off them (:func:`_locate`)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import (
        PrefixChange,
        WeightConverter,
        WeightRenaming,
        apply_converters,
        apply_renamings,
        dot_natural_key,
    )

    from ..architectures import hf

    state = model.state_dict()

    def whole(name: str) -> list[tuple[str, Box]]:
        shape = tuple(state[name].shape)
        return [(name, ((0,) * len(shape), tuple(range(len(shape))), (0,) * len(shape), shape))]

    with hf._quiet():
        conversions = get_model_conversion_mapping(model, add_legacy=False)
    conversions = [c for c in conversions if not isinstance(c, PrefixChange)]
    if not conversions:
        return {name: whole(name) for name in state}
    reverse = [c.reverse_transform() for c in conversions[::-1]]
    renamings = [c for c in reverse if isinstance(c, WeightRenaming)]
    converters = [c for c in reverse if isinstance(c, WeightConverter)]
    by_pattern = {p: c for c in converters for p in c.source_patterns}
    out: dict[str, list[tuple[str, Box]]] = {}
    pending: dict[str, list[tuple[str, str]]] = {}
    for name in sorted(state, key=dot_natural_key):
        target, pattern = apply_converters(name, converters)
        if pattern is None:
            out[apply_renamings(name, renamings)] = whole(name)
            continue
        pending.setdefault(target, []).append((name, pattern))
    for target, inputs in pending.items():
        shapes = {src: tuple(state[src].shape) for src, _ in inputs}
        for out_name, parts in _locate(by_pattern[inputs[0][1]], target, inputs, shapes, model).items():
            out[apply_renamings(out_name, renamings)] = parts
    return out


def _locate(converter, target: str, inputs: list[tuple[str, str]], shapes: dict[str, tuple[int, ...]],
            model) -> dict[str, list[tuple[str, Box]]]:
    """Each output of ``converter`` on the in-memory tensors ``inputs`` ((name, pattern) pairs), as
    boxes of those tensors.

    First on the meta device with ``contiguous()`` made a no-op: transformers' MoE conversions are
    chunks, unbinds, squeezes and transposes of one tensor, so every output is then a view of the
    probe and its storage offset and strides say where it sits, whatever the size (DeepSeek-V3's
    experts hold 7.5e9 elements per layer). Otherwise (several inputs, or an output that is a
    copy) on ``arange`` probes, one int64 per element, up to :data:`MAX_PROBE_ELEMENTS` in all."""
    import copy

    import torch
    from torch.overrides import TorchFunctionMode

    from ..architectures import hf

    class _NoCopies(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.Tensor.contiguous:
                return args[0]
            return func(*args, **(kwargs or {}))

    def run(probes, mode) -> dict[str, Any]:
        fresh = copy.deepcopy(converter)
        for (src, pattern), probe in zip(inputs, probes):
            fresh.add_tensor(target, src, pattern, probe)
        with hf._quiet(), mode:
            outputs = fresh.convert(target, model=model, config=model.config)
        return {k: (v[0] if isinstance(v, list) else v) for k, v in outputs.items()}

    if len(inputs) == 1:
        src, shape = inputs[0][0], shapes[inputs[0][0]]
        meta = torch.empty(shape, dtype=torch.int64, device="meta")
        outputs = run([meta], _NoCopies())
        if _all_views(outputs, meta):
            return {k: [(src, _view_box(t, shape, k, src))] for k, t in outputs.items()}
    sizes = [math.prod(shapes[src]) for src, _ in inputs]
    if sum(sizes) > MAX_PROBE_ELEMENTS:
        raise ValueError(f"module: {inputs[0][0]!r} is too large to locate its stored tensors ({sum(sizes)} elements)")
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    probes = [torch.arange(int(o), int(o) + n, dtype=torch.int64).view(shapes[src])
              for (src, _), o, n in zip(inputs, offsets, sizes)]
    outputs = run(probes, contextlib.nullcontext())
    located: dict[str, list[tuple[str, Box]]] = {}
    for name, t in outputs.items():
        vals = t.detach().to(torch.int64).reshape(-1).numpy()
        parts = []
        for (src, _), o, n in zip(inputs, offsets, sizes):
            where = np.nonzero((vals >= o) & (vals < o + n))[0]
            if where.size:
                parts.append((src, _pair_box(where, vals[where] - o, tuple(t.shape), shapes[src], name, src)))
        if sum(math.prod(box[3]) for _, box in parts) != vals.size:
            raise ValueError(f"module: the stored tensor {name!r} holds values that no in-memory tensor has; "
                             "this conversion is not supported")
        located[name] = parts
    return located


def _all_views(outputs: dict[str, Any], probe) -> bool:
    return all(t is probe or t._base is probe for t in outputs.values())


def _view_box(view, src_shape: tuple[int, ...], out_name: str, src: str) -> Box:
    """A view of a contiguous tensor of ``src_shape`` as a box of it: each dimension of the view
    that is longer than 1 steps one source dimension (the one with that stride), from the start
    its storage offset gives, without running past that dimension's end."""
    strides = [math.prod(src_shape[d + 1:]) for d in range(len(src_shape))]
    off = view.storage_offset()
    start = [int(s) for s in np.unravel_index(off, src_shape)] if src_shape else []
    d2s, used = [], set()
    for n, st in zip(view.shape, view.stride()):
        if n == 1:
            d2s.append(-1)
            continue
        cands = [d for d in range(len(src_shape)) if strides[d] == st and src_shape[d] > 1 and d not in used]
        if not cands or start[cands[0]] + n > src_shape[cands[0]]:
            raise ValueError(f"module: the stored tensor {out_name!r} is not a block of {src!r}; this conversion is not supported")
        used.add(cands[0])
        d2s.append(cands[0])
    shape = tuple(int(n) for n in view.shape)
    return tuple(start), tuple(d2s), (0,) * len(shape), shape


def _pair_box(where: np.ndarray, values: np.ndarray, out_shape: tuple[int, ...], src_shape: tuple[int, ...],
              out_name: str, src: str) -> Box:
    """The elements of output ``out_name`` at flat positions ``where`` (ascending) hold source
    elements ``values``: both must be boxes, the output's dims running along distinct source
    dims (ValueError naming both otherwise)."""
    bad = ValueError(f"module: the stored tensor {out_name!r} is not made of blocks of {src!r}; this conversion is not supported")
    m = where.size
    oc = np.stack(np.unravel_index(where, out_shape)) if out_shape else np.zeros((0, m), np.int64)
    sc = np.stack(np.unravel_index(values, src_shape)) if src_shape else np.zeros((0, m), np.int64)
    o0, olen = oc.min(axis=1), oc.max(axis=1) - oc.min(axis=1) + 1
    s0, slen = sc.min(axis=1), sc.max(axis=1) - sc.min(axis=1) + 1
    if math.prod(olen.tolist()) != m or math.prod(slen.tolist()) != m:
        raise bad
    d2s, used = [], set()
    for k in range(len(out_shape)):
        if olen[k] == 1:
            d2s.append(-1)
            continue
        j = math.prod(olen[k + 1:].tolist())  # the box's element one step along dim k (where is row-major)
        diff = sc[:, j] - sc[:, 0]
        nz = np.nonzero(diff)[0]
        if nz.size != 1 or diff[nz[0]] != 1 or int(nz[0]) in used or slen[nz[0]] != olen[k]:
            raise bad
        used.add(int(nz[0]))
        d2s.append(int(nz[0]))
    if any(slen[d] > 1 and d not in used for d in range(len(src_shape))):
        raise bad
    expect = np.repeat(s0[:, None], m, axis=1)
    grid = np.indices(olen.tolist()).reshape(len(out_shape), -1) if out_shape else np.zeros((0, m), np.int64)
    for k, d in enumerate(d2s):
        if d >= 0:
            expect[d] += grid[k]
    if not np.array_equal(np.ravel_multi_index(expect, src_shape) if src_shape else np.zeros(m, np.int64), values):
        raise bad
    return (tuple(int(v) for v in s0), tuple(d2s), tuple(int(v) for v in o0), tuple(int(v) for v in olen))


def _plain_spec(module, named, real: dict[str, str]) -> tuple[ModelSpec, dict[str, list[Piece]]]:
    """A spec of any module's own tensors: kinds, roles and fans from module types and names."""
    from ..architectures.roles import ModuleInfo, describe

    tensors: list[TensorSpec] = []
    pieces: dict[str, list[Piece]] = {}
    first: dict[int, str] = {}
    tied: dict[str, str] = {}
    for name, t in named:
        if id(t) in first:
            tied[name] = first[id(t)]
            pieces[name] = pieces[first[id(t)]]
            continue
        first[id(t)] = name
        shape = tuple(int(d) for d in t.shape)
        if not shape:
            shape_spec = (1,)  # a scalar: one element
        else:
            shape_spec = shape
        info = ModuleInfo.of(module, real.get(name, name))
        kind, role, param, layer, fan_in, fan_out, padding = describe(name, shape_spec, info)
        tensors.append(TensorSpec(name, shape_spec, kind=kind, role=role, param=param, layer=layer,
                                  fan_in=fan_in, fan_out=fan_out, padding_idx=padding))
        pieces[name] = [(len(tensors) - 1, (0,) * len(shape), tuple(range(len(shape))) if shape else (-1,),
                         (0,) * len(shape_spec), shape_spec)]
    layers = [t.layer for t in tensors if t.layer is not None]
    hidden = max((t.fan_in for t in tensors if t.kind in ("linear", "embedding")), default=1) or 1
    spec = ModelSpec(
        family="module", architecture=type(getattr(module, "_orig_mod", module)).__name__, config={},
        tensors=tuple(tensors), n_layers=max(layers) + 1 if layers else 1, hidden_size=hidden,
        initializer_range=0.02, tied=tied,
    )
    return spec, pieces


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


# --- generation ----------------------------------------------------------------------------------


class _Filler:
    """Writes pieces of stored tensors into (local shards of) module tensors."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._cpu = None

    def _cpu_fill_runs(self):
        if self._cpu is None:
            from ..engine.backends import REFERENCE, select

            if self.device == "reference":
                self._cpu = REFERENCE.fill_runs
            else:
                try:
                    self._cpu = select("cpu").fill_runs
                except ValueError:
                    if self.device == "cpu":
                        raise
                    self._cpu = REFERENCE.fill_runs
        return self._cpu

    def _gen_runs(self, flat_u8, sampler, key, starts, counts, dtype: str) -> None:
        """The runs' elements, back to back, into ``flat_u8`` (a contiguous 1-D uint8 torch tensor)."""
        if flat_u8.device.type == "cpu":
            self._cpu_fill_runs()(flat_u8.numpy(), sampler, key, starts, counts, dtype)
        elif flat_u8.device.type == "cuda":
            from ..engine import cuda

            cuda.generate_runs_into(flat_u8, sampler, key, starts, counts, dtype)
        else:
            raise ValueError(f"module: tensors on {flat_u8.device.type} are not supported (cpu, cuda)")

    def fill_piece(self, local, sets, tspec: TensorSpec, sampler, key, dtype: str, start: tuple[int, ...],
                   disk_to_src: tuple[int, ...], disk_start: tuple[int, ...] | None = None,
                   length: tuple[int, ...] | None = None) -> None:
        """Fill the box of stored tensor ``tspec`` that starts at ``disk_start`` and is ``length``
        long per disk dim (default: all of it) where it sits in the module tensor: from ``start``
        per module dim, disk dim ``k`` running along module dim ``disk_to_src[k]`` (-1: a unit
        dim). ``local`` holds the global indices ``sets`` of the module tensor."""
        import torch

        disk_shape = tspec.shape
        disk_start = disk_start or (0,) * len(disk_shape)
        length = length or tuple(disk_shape)
        ndim = local.dim()
        # per module dim: the box, the global indices held, the local positions of those in the box
        ext = [1] * ndim
        for k, d in enumerate(disk_to_src):
            if d >= 0:
                ext[d] = length[k]
        pos: list[np.ndarray | None] = []  # None: every local position (the dim is whole and inside the box)
        rel: list[np.ndarray | None] = []  # box-relative indices (None: the whole box)
        for d in range(ndim):
            s = sets[d]
            b0, n = start[d], ext[d]
            full_dim = local.shape[d]
            if s is None:
                if b0 == 0 and n == full_dim:
                    pos.append(None)
                    rel.append(None)
                else:
                    pos.append(np.arange(b0, b0 + n))
                    rel.append(None)
                continue
            mask = (s >= b0) & (s < b0 + n)
            p = np.nonzero(mask)[0]
            if p.size == 0:
                return
            r = s[p] - b0
            pos.append(None if p.size == full_dim else p)
            rel.append(None if (r.size == n) else r)  # sorted and unique, so n of them: all
        # index sets in disk order
        krel = []
        for k, d in enumerate(disk_to_src):
            if d < 0:
                krel.append(np.array([disk_start[k]], dtype=np.int64))
            elif rel[d] is None:
                whole = disk_start[k] == 0 and length[k] == disk_shape[k]
                krel.append(None if whole else np.arange(disk_start[k], disk_start[k] + length[k], dtype=np.int64))
            else:
                krel.append(rel[d] + disk_start[k])
        sizes = [1 if d < 0 else (length[k] if rel[d] is None else len(rel[d])) for k, d in enumerate(disk_to_src)]
        identity = tuple(disk_to_src) == tuple(range(ndim)) and len(disk_shape) == ndim
        direct = identity and all(p is None for p in pos) and local.is_contiguous()
        if direct:
            buf = local
        else:
            buf = torch.empty(sizes, dtype=local.dtype, device=local.device)
        flat = buf.reshape(-1).view(torch.uint8)
        self._runs(flat, disk_shape, krel, sampler, key, dtype)
        if direct:
            return
        # disk order -> module order: drop unit disk dims, permute, add the module's unit dims
        mapped = [(d, k) for k, d in enumerate(disk_to_src) if d >= 0]
        vals = buf.reshape([sizes[k] for _, k in mapped]) if mapped else buf.reshape([])
        order = sorted(range(len(mapped)), key=lambda i: mapped[i][0])
        vals = vals.permute(order) if mapped else vals
        shape = [1] * ndim
        for d, k in mapped:
            shape[d] = sizes[k]
        vals = vals.reshape(shape)
        if all(p is None or _is_range(p) for p in pos):
            index = tuple(slice(None) if p is None else slice(int(p[0]), int(p[-1]) + 1) for p in pos)
            local[index] = vals
        else:
            index = tuple(
                (torch.arange(local.shape[d]) if p is None else torch.from_numpy(p)).to(local.device).view(
                    [-1 if j == d else 1 for j in range(ndim)])
                for d, p in enumerate(pos)
            )
            local[index] = vals

    def _runs(self, flat_u8, disk_shape, krel, sampler, key, dtype: str) -> None:
        """Generate the product of ``krel`` (per disk dim: indices, None for all) in row-major
        order into ``flat_u8``, a batch of runs of consecutive flat indices at a time."""
        item = DTYPE_ITEMSIZE[dtype]
        pos = 0
        for starts, counts in box_runs(disk_shape, krel):
            n = int(counts.sum()) * item
            self._gen_runs(flat_u8[pos:pos + n], sampler, key, starts, counts, dtype)
            pos += n


def _is_range(p: np.ndarray) -> bool:
    return p.size > 0 and int(p[-1]) - int(p[0]) + 1 == p.size

