"""A torchtitan model: where each tensor of the Hugging Face spec it corresponds to sits in its
in-memory parameters, read off torchtitan's own code.

torchtitan keeps its own module tree (``tok_embeddings``, ``layers.N.attention.qkv_linear.wqkv``
fused and grouped per KV head, ``feed_forward.w1/w2/w3``), and converts it to the Hugging Face
layout in two steps of its own: the modules' state-dict hooks (a fused ``wqkv`` saved as
``wq``/``wk``/``wv``) and the model's ``StateDictAdapter.to_hf`` (names, and the q/k rows
permuted per head for RoPE). Both run here on a twin of the model built on the meta device from
its config, never on the model itself (whose hooks would gather a sharded tensor):

1. every output of ``to_hf`` that is a view of a parameter (most: renamed, untouched) is located
   from its strides (:func:`~.placement.view_box`), whatever the size;
2. the parameters whose outputs are copies (the fused, permuted projections) are run again as
   index probes, one layer of each structure only, and each output is read back as a box with
   index arrays (:func:`~.placement.indexed_box`); the other layers of that structure take the same
   boxes under their own layer number, checked against the first step's names and shapes.

The spec is the Hugging Face config the model corresponds to (``init_module_(..., spec=...)``, or,
without one, the config :mod:`.torchtitan_config` derives from the model's own ``config``):
every tensor ``to_hf`` gives must be a tensor of the spec with its shape, and every tensor of the
spec must come out exactly once, or the model is refused, naming the first that differs.

torchtitan is imported only here, only when such a model is passed.
"""
from __future__ import annotations

import importlib
import math
import re
from typing import Any

import numpy as np

from ..core.tensors import ModelSpec
from .fill import Box, Piece
from .placement import MAX_PROBE_ELEMENTS, indexed_box, view_box
from .stack import Layout, StackBase, lacking, not_in_spec

_LAYER = re.compile(r"(?<![A-Za-z0-9_])layers\.(\d+)\.")


def is_torchtitan_model(module) -> bool:
    """Whether ``module`` (its wrappers removed: ``modules.unwrap``) is a torchtitan model (its class is
    defined in ``torchtitan.models``)."""
    return any(c.__module__.startswith("torchtitan.models.") for c in type(module).__mro__)


def init_stack_buffers(model) -> tuple[str, ...]:
    """torchtitan's own init of its buffers, which are not weights and draw nothing (RoPE tables,
    an MoE's load-balancing bias and token counters): each module's ``_init_self_buffers`` on the
    device its buffers are on, as ``init_states`` runs it, without its parameters' init. The
    persistent ones' names. A DTensor buffer (torchtitan's own parallelize makes the RoPE table
    one under TP) is computed whole and put back in its placements as ``init_states`` does, each
    rank keeping its own part (``src_data_rank=None``: every rank computed the same, so nothing
    is broadcast). A tied model's embedding is tied to its output again first, as
    ``Decoder.init_states`` does: ``to_empty`` gave each a tensor of its own."""
    from torch.distributed.tensor import DTensor, distribute_tensor
    from torchtitan.protocols.module import Module

    from .modules import strip_wrappers

    if getattr(model, "enable_weight_tying", False) and getattr(model, "tok_embeddings", None) is not None \
            and getattr(model, "lm_head", None) is not None:  # left untied, training would move the two apart
        model.tok_embeddings.weight = model.lm_head.weight
    persistent: list[str] = []
    for real, m in model.named_modules():
        prefix = strip_wrappers(real)  # activation checkpointing's CheckpointWrapper: the model's own names
        if not isinstance(m, Module) or type(m)._init_self_buffers is Module._init_self_buffers:
            continue
        buffers = {n: b for n, b in m._buffers.items() if b is not None}
        if not buffers:
            continue
        placed = {n: (b.device_mesh, b.placements) for n, b in buffers.items() if isinstance(b, DTensor)}
        with m._preserve_buffer_spmd_types():
            m._init_self_buffers(buffer_device=next(iter(buffers.values())).device)
        for n, (mesh, placements) in placed.items():
            new = m._buffers.get(n)
            if new is None or isinstance(new, DTensor):  # not recomputed whole: its values would be the old ones
                raise ValueError(f"module: {prefix}.{n} is a DTensor buffer torchtitan's _init_self_buffers does not "
                                 "recompute; call the model's init_states() first, then init_module_ (it overwrites "
                                 "the parameters only)")
            m.register_buffer(n, distribute_tensor(new, mesh, list(placements), src_data_rank=None),
                              persistent=n not in m._non_persistent_buffers_set)
        persistent += [f"{prefix}.{n}" if prefix else n for n in m._buffers if n not in m._non_persistent_buffers_set
                       and m._buffers[n] is not None]
    return tuple(persistent)


def _adapter(model) -> Any:
    """torchtitan's ``StateDictAdapter`` for ``model``'s family (``torchtitan.models.<family>``)."""
    from torchtitan.protocols.state_dict_adapter import StateDictAdapter

    cls = next(c for c in type(model).__mro__ if c.__module__.startswith("torchtitan.models."))
    family = ".".join(cls.__module__.split(".")[:3])
    try:
        module = importlib.import_module(f"{family}.state_dict_adapter")
    except ImportError:
        raise ValueError(f"module: torchtitan's {family} has no state_dict_adapter; modelinit maps a torchtitan "
                         "model to its Hugging Face layout through it") from None
    found = [v for v in vars(module).values()
             if isinstance(v, type) and issubclass(v, StateDictAdapter) and v is not StateDictAdapter
             and v.__module__ == module.__name__]
    if len(found) != 1:
        raise ValueError(f"module: {module.__name__} defines {len(found)} state-dict adapters; expected one")
    return found[0](model.config, None)


def _twin(model) -> Any:
    """The model built again from its config on the meta device (unsharded, nothing allocated)."""
    import torch

    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "build"):
        raise ValueError(f"module: {type(model).__name__} has no buildable config (model.config.build()); "
                         "modelinit rebuilds a torchtitan model's twin on the meta device from it")
    with torch.device("meta"):
        return config.build()


def _to_hf(twin, adapter) -> dict[str, Any]:
    return adapter.to_hf(dict(twin.state_dict(keep_vars=True)))  # the parameters themselves: identity is seen


def _layer(name: str) -> str | None:
    m = _LAYER.search(name)
    return m.group(1) if m else None


def _in_layer(name: str, layer: str, other: str) -> str:
    """``name`` (of layer ``layer``) renamed to layer ``other``."""
    return _LAYER.sub(lambda m: f"layers.{other}." if m.group(1) == layer else m.group(0), name, count=1)


def _slots(twin, name: str) -> tuple[dict, str, bool]:
    """The dict of ``name``'s module that holds it (its parameters or its buffers), its leaf name,
    and whether it is a parameter."""
    owner, _, leaf = name.rpartition(".")
    module = twin.get_submodule(owner) if owner else twin
    is_param = leaf in module._parameters
    return (module._parameters if is_param else module._buffers), leaf, is_param


def torchtitan_spec(model, spec: ModelSpec, shapes: dict[str, tuple[int, ...]],
                    partial: bool = False) -> tuple[ModelSpec, dict[str, list[Piece]], int]:
    """Where each of ``model``'s tensors (``shapes``: name -> the global shape it holds) gets its
    bytes from, as pieces of ``spec``'s tensors, and how many of the spec's tensors the model lacks
    (``partial``: a pipeline stage; otherwise any is refused). A persistent buffer the Hugging Face
    layout leaves out gets no pieces: it is the stack's own state (:func:`init_stack_buffers`)."""
    adapter = _adapter(model)
    twin = _twin(model)
    params = dict(twin.named_parameters(remove_duplicate=False))  # tied ones under each name
    buffers = {n: b for n, b in twin.named_buffers() if n.rpartition(".")[2] not in
               twin.get_submodule(n.rpartition(".")[0])._non_persistent_buffers_set}
    params.update(buffers)  # a persistent buffer the Hugging Face layout stores (DeepSeek-V3's expert bias) is a weight
    aliases: dict[int, list[str]] = {}
    for n, p in params.items():
        aliases.setdefault(id(p), []).append(n)
    for name, shape in shapes.items():
        if name not in params:
            raise ValueError(f"module: {name!r} is not a parameter of {type(model).__name__} built from its config")
        if tuple(params[name].shape) != shape:
            raise ValueError(f"module: {name!r} is {list(shape)}, but {type(model).__name__} built from its config "
                             f"has {list(params[name].shape)}")
    by_name = {t.name: i for i, t in enumerate(spec.tensors)}
    outputs = _to_hf(twin, adapter)
    for hf_name, t in outputs.items():
        if hf_name not in by_name:
            raise not_in_spec(f"torchtitan's {type(model).__name__}", hf_name, spec)
        want = tuple(spec.tensors[by_name[hf_name]].shape)
        if tuple(t.shape) != want:
            raise ValueError(f"module: torchtitan stores {hf_name!r} as {list(t.shape)}, the spec has {list(want)}: the model "
                             "does not match the spec (check its sizes: hidden, heads, KV heads, vocabulary, FFN)")
    ident = {id(p): n for n, p in params.items()}
    located: dict[str, tuple[str, Box]] = {}  # HF name -> (module parameter, box)
    copies: list[str] = []
    for hf_name, t in outputs.items():
        src = ident.get(id(t)) or (ident.get(id(t._base)) if t._base is not None else None)
        if src is None:
            copies.append(hf_name)
        else:
            located[hf_name] = (src, view_box(t, tuple(params[src].shape), hf_name, src))
    if copies:
        located.update(_probe_copies(twin, adapter, params, copies, located, outputs))

    pieces: dict[str, list[Piece]] = {name: [] for name in shapes}
    covered: dict[str, int] = {}
    for hf_name, (src, box) in located.items():
        covered[hf_name] = covered.get(hf_name, 0) + 1
        for name in aliases[id(params[src])]:  # a tied parameter takes its bytes under each of its names
            if name in pieces:
                pieces[name].append((by_name[hf_name], *box))
    missing = [t.name for t in spec.tensors if t.name not in covered]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"module: the spec's {missing[0]!r}{more} is in no parameter of {type(model).__name__}: "
                         "the model does not match the spec")
    unfilled = [n for n, ps in pieces.items() if sum(math.prod(p[4]) for p in ps) != math.prod(shapes[n])
                and not (n in buffers and not ps)]  # a buffer to_hf leaves out is the stack's own state
    if unfilled:
        raise ValueError(f"module: {unfilled[0]!r} is not wholly made of the spec's tensors; this layout is not supported")
    held = {by_name[h] for h, (src, _) in located.items() if any(n in shapes for n in aliases[id(params[src])])}
    return spec, pieces, lacking(spec, held, partial, "; a pipeline stage is filled with partial=True")


def _probe_copies(twin, adapter, params: dict[str, Any], copies: list[str], located: dict[str, tuple[str, Box]],
                  outputs: dict[str, Any]) -> dict[str, tuple[str, Box]]:
    """The outputs ``copies`` (not views of a parameter) located on index probes: the parameters
    that back no view are probed, one layer per structure, and the layers alike take its boxes.
    A parameter outside the layers (the embedding: 262 M elements in Llama 3's) is probed only
    if a copy is still unlocated after the layers: probing costs its size, whatever the shard."""
    viewed = {src for src, _ in located.values()}
    unviewed = [n for n in params if n not in viewed]
    # Layers with the same parameters (relative names, shapes) share a structure: probe the first.
    def signature(layer: str) -> tuple:
        return tuple(sorted((_in_layer(n, layer, "#"), tuple(params[n].shape)) for n in params if _layer(n) == layer))

    groups: dict[tuple, list[str]] = {}
    for layer in sorted({_layer(n) for n in unviewed if _layer(n) is not None}, key=int):
        groups.setdefault(signature(layer), []).append(layer)
    out: dict[str, tuple[str, Box]] = {}
    for layers in groups.values():
        out.update(_probed(twin, adapter, params, [n for n in unviewed if _layer(n) == layers[0]], copies))
    for layers in groups.values():  # the probed layer's boxes, under each other layer's number
        first = layers[0]
        mine = {h: v for h, v in out.items() if _layer(h) == first and _layer(v[0]) == first}
        for layer in layers[1:]:
            for h, (src, box) in mine.items():
                name = _in_layer(h, first, layer)
                if name not in outputs or tuple(outputs[name].shape) != tuple(outputs[h].shape):
                    raise ValueError(f"module: layer {layer} does not store {name!r} as layer {first} stores {h!r}; "
                                     "this layout is not supported")
                out[name] = (_in_layer(src, first, layer), box)
    for n in unviewed:
        if _layer(n) is None and any(h not in out for h in copies):
            out.update(_probed(twin, adapter, params, [n], copies))
    unlocated = [h for h in copies if h not in out]
    if unlocated:
        raise ValueError(f"module: torchtitan's {unlocated[0]!r} could not be located in the model's parameters")
    return out


def _probed(twin, adapter, params: dict[str, Any], names: list[str], copies: list[str]) -> dict[str, tuple[str, Box]]:
    """Where the ``copies`` that come from ``names`` (parameters of ``twin``) sit in them: each
    parameter set to consecutive indices (one range after another), the model converted by the
    adapter, each copy's indices read back."""
    import torch

    sizes = [math.prod(params[n].shape) for n in names]
    if sum(sizes) > MAX_PROBE_ELEMENTS:
        raise ValueError(f"module: {names[0]!r} is too large to locate its stored tensors ({sum(sizes)} elements)")
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    saved = {}
    try:
        for n, o, size in zip(names, offsets, sizes):
            slots, leaf, is_param = _slots(twin, n)
            saved[n] = slots[leaf]
            probe = torch.arange(int(o), int(o) + size, dtype=torch.int64).view(tuple(params[n].shape))
            slots[leaf] = torch.nn.Parameter(probe, requires_grad=False) if is_param else probe
        with torch.no_grad():
            probed = _to_hf(twin, adapter)
    finally:
        for n, p in saved.items():
            slots, leaf, _ = _slots(twin, n)
            slots[leaf] = p
    out = {}
    for hf_name, t in probed.items():
        if hf_name not in copies or t.device.type == "meta":
            continue
        vals = t.detach().to(torch.int64).reshape(-1).numpy()
        k = int(np.searchsorted(offsets, vals[0], side="right")) - 1 if vals.size else 0
        src, o = names[k], offsets[k]
        if vals.size and (vals.min() < o or vals.max() >= offsets[k + 1]):
            raise ValueError(f"module: torchtitan's {hf_name!r} mixes several parameters; this layout is not supported")
        out[hf_name] = (src, indexed_box(vals - o, tuple(t.shape), tuple(params[src].shape), hf_name, src))
    return out


class TorchtitanStack(StackBase):
    """A torchtitan model, filled with the bytes of the Hugging Face model it corresponds to."""

    name = "torchtitan"
    takes_spec = True

    def recognizes(self, module) -> bool:
        return is_torchtitan_model(module)

    def own_config(self, module) -> dict | None:
        from .torchtitan_config import own_config

        return own_config(module)

    def prepare(self, module) -> tuple[str, ...]:
        # its buffers are its own code's; a tied embedding is tied again before the tensors are listed
        return init_stack_buffers(module)

    def layout(self, module, spec, named, real, partial) -> Layout:
        model_spec, pieces, missing = torchtitan_spec(module, spec, {n: tuple(t.shape) for n, t in named}, partial)
        return Layout(model_spec, pieces, missing, own_state=frozenset(n for n, _ in named if not pieces[n]))


STACK = TorchtitanStack()
