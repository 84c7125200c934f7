"""Any module other than a transformers model: a spec of its own tensors.

Each parameter and persistent buffer is one stored tensor, named as the module names it, with a
kind, role, layer and fans read from the module types around it (``architectures.roles``, the
describer the generic transformers path uses too), so that a policy's rules can match it.

Imports core.tensors, :mod:`.fill`'s Piece, and ``architectures.roles`` (inside the function).
"""
from __future__ import annotations

from ..core.tensors import ModelSpec, TensorSpec
from .fill import Piece
from .stack import Layout, StackBase


def plain_spec(module, named, real: dict[str, str]) -> tuple[ModelSpec, dict[str, list[Piece]]]:
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
        family="module", architecture=type(module).__name__, config={},
        tensors=tuple(tensors), n_layers=max(layers) + 1 if layers else 1, hidden_size=hidden,
        initializer_range=0.02, tied=tied,
    )
    return spec, pieces


class PlainStack(StackBase):
    """Any module: a spec of its own tensors (asked last: it recognizes every module)."""

    name = "plain"

    def recognizes(self, module) -> bool:
        return True

    def layout(self, module, spec, named, real, partial) -> Layout:
        model_spec, pieces = plain_spec(module, named, real)
        return Layout(model_spec, pieces)


STACK = PlainStack()
