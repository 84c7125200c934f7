"""A transformers model: its spec, and where each stored tensor's elements sit in its in-memory
tensors.

The spec is the one a request with the model's config and class resolves to (so ``modelinit
init`` of that config writes the same bytes). save_pretrained stores some tensors other than as
the model holds them (MoE experts fused in memory, ``[E, 2I, H]``, are stored per expert; a
stored ``Wqkv`` is three in-memory tensors): transformers' own reverse conversion
(:func:`~modelinit_server.architectures.hf.reverse_conversions`) is run on probes of the
in-memory tensors, and each stored tensor's place in them is read off its outputs as boxes.

Imports the architectures (inside the functions: only a transformers model needs them),
core.tensors and :mod:`.fill`'s Box and Piece.
"""
from __future__ import annotations

import contextlib
import math
import sys
from typing import Any

import numpy as np

from ..core.tensors import ModelSpec
from .fill import Box, Piece
from .placement import MAX_PROBE_ELEMENTS, all_views, pair_box, view_box
from .stack import Layout, StackBase



def hf_model(module):
    """``module`` (its wrappers removed: ``modules.unwrap``) if it is a transformers model, else None."""
    tf = sys.modules.get("transformers")
    if tf is None:
        return None
    try:
        base = tf.PreTrainedModel
    except Exception:  # noqa: BLE001
        return None
    return module if isinstance(module, base) else None


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


def hf_spec(model, shapes: dict[str, tuple[int, ...]],
            partial: bool = False) -> tuple[ModelSpec, dict[str, list[Piece]], int]:
    """The spec of a transformers model, where each of its tensors (``shapes``: name -> the global
    shape the module holds) gets its bytes from, and how many stored tensors it lacks (``partial``:
    a pipeline stage; otherwise any is refused)."""
    from .. import architectures
    from ..architectures import hf, meta_models

    cls = _hf_class(model)
    document = hf.config_document(model.config, cls.__name__)
    spec = architectures.from_config(document, cls.__name__)
    index = {t.name: i for i, t in enumerate(spec.tensors)}
    meta = meta_models.meta_model(document, cls, tie=True)
    layout = _disk_sources(meta)  # disk name -> [(in-memory name, Box)]
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


def _disk_sources(model) -> dict[str, list[tuple[str, Box]]]:
    """For every disk tensor save_pretrained would write from ``model``'s state_dict: the in-memory
    tensors it is made of and where (one, unless a conversion concatenates several: Nomic-BERT's
    ``attn.Wqkv`` of ``q_proj``, ``k_proj``, ``v_proj``). The reverse conversion the spec's layout
    comes from (``hf.reverse_conversions``) runs on probes of the in-memory tensors, and where each
    output's elements come from is read off them (:func:`_locate`)."""
    from transformers.core_model_loading import apply_converters, apply_renamings, dot_natural_key

    from ..architectures import hf

    state = model.state_dict()

    def whole(name: str) -> list[tuple[str, Box]]:
        shape = tuple(state[name].shape)
        return [(name, ((0,) * len(shape), tuple(range(len(shape))), (0,) * len(shape), shape))]

    renamings, converters = hf.reverse_conversions(model)
    if not renamings and not converters:
        return {name: whole(name) for name in state}
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
        with mode:
            return hf.convert(fresh, target, model)

    if len(inputs) == 1:
        src, shape = inputs[0][0], shapes[inputs[0][0]]
        meta = torch.empty(shape, dtype=torch.int64, device="meta")
        outputs = run([meta], _NoCopies())
        if all_views(outputs, meta):
            return {k: [(src, view_box(t, shape, k, src))] for k, t in outputs.items()}
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
                parts.append((src, pair_box(where, vals[where] - o, tuple(t.shape), shapes[src], name, src)))
        if sum(math.prod(box[3]) for _, box in parts) != vals.size:
            raise ValueError(f"module: the stored tensor {name!r} holds values that no in-memory tensor has; "
                             "this conversion is not supported")
        located[name] = parts
    return located


class TransformersStack(StackBase):
    """A transformers model: its spec from its own config and class, as a request with them."""

    name = "transformers"

    def recognizes(self, module) -> bool:
        return hf_model(module) is not None

    def layout(self, module, spec, named, real, partial) -> Layout:
        model_spec, pieces, missing = hf_spec(hf_model(module), {n: tuple(t.shape) for n, t in named}, partial)
        return Layout(model_spec, pieces, missing)


STACK = TransformersStack()
