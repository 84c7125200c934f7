"""Architectures: resolve a preset or an HF ``config.json`` into the exact tensors of its model.

Pure Python: nothing is materialized. Tensor names, order and shapes are those of the HF model
class ``config.architectures[0]`` (transformers 5.23) as ``save_pretrained`` stores it: tied
weights appear once (the other names are in ``ModelSpec.tied``) and non-persistent buffers not at
all. The returned ``ModelSpec.config`` is the complete config (transformers' defaults and
derivations filled in) to write as ``config.json``; it carries no dtype.

Imports: ``core`` (the tensors and the variance-scaling primitive) and ``engine`` (the replay of
computed tensors draws from it), nothing above; transformers only through :mod:`.meta_models`
and :mod:`.hf`, when a spec needs it. Callers outside use the public names only: ``from_preset``,
``from_config``, the modules ``hf`` and ``meta_models`` (a test checks it).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from modelinit_wire.quoting import quote

from ..core.tensors import ModelSpec
from . import bert, gpt2, llama
from ._family import Family
from ._fields import invalid, load_document  # noqa: F401
from .presets import PRESET_EXTRAS, PRESETS

__all__ = ["PRESETS", "FAMILIES", "preset_names", "from_preset", "from_config"]

#: Supported HF ``model_type`` values and their model classes (the first is the default).
FAMILIES: dict[str, Family] = {f.model_type: f for f in (*bert.FAMILIES, *gpt2.FAMILIES, *llama.FAMILIES)}


def preset_names() -> list[str]:
    """Names accepted by :func:`from_preset`."""
    return list(PRESETS)


def from_preset(name: str, architecture: str = "") -> ModelSpec:
    """The spec of a preset architecture; an unknown name is a ``ValueError`` listing the presets.
    ``architecture`` (a class name) overrides the preset's class."""
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"spec.preset: unknown preset {quote(name)}; use one of: {', '.join(PRESETS)}")
    spec = from_config(PRESETS[name], architecture)  # from_config works on a copy
    if architecture:
        return spec  # exactly the class asked for
    for extra in PRESET_EXTRAS.get(name, ()):
        spec = with_extra_tensors(spec, from_config(PRESETS[name], extra))
    return spec


def with_extra_tensors(spec: ModelSpec, extra: ModelSpec) -> ModelSpec:
    """``spec`` plus the tensors of ``extra`` (another class of the family) that it lacks, named as
    ``spec``'s class would name them: backbone tensors under its base-model prefix, heads as they are.
    Backbone additions follow the backbone, head additions come last."""
    def canonical(name: str, prefix: str) -> tuple[str, bool]:
        if prefix and name.startswith(prefix + "."):
            return name[len(prefix) + 1:], True
        return name, not prefix  # a base class's tensors are all backbone

    def full(name: str) -> str:
        return f"{spec.base_model_prefix}.{name}" if spec.base_model_prefix else name

    have = {canonical(t.name, spec.base_model_prefix)[0] for t in spec.tensors} | set(spec.tied)
    backbone, heads = [], []
    for t in extra.tensors:
        name, in_backbone = canonical(t.name, extra.base_model_prefix)
        if name in have or (not in_backbone and t.name in have):
            continue
        (backbone if in_backbone else heads).append(dataclasses.replace(t, name=full(name) if in_backbone else name))
    if not backbone and not heads:
        return spec
    tensors = list(spec.tensors)
    last = max((i for i, t in enumerate(tensors) if canonical(t.name, spec.base_model_prefix)[1]), default=-1)
    tensors[last + 1:last + 1] = backbone
    return dataclasses.replace(spec, tensors=tuple(tensors + heads))


def from_config(config: Mapping[str, Any] | str, architecture: str = "") -> ModelSpec:
    """The spec of an HF config, given as a mapping or as ``config.json`` text.

    ``model_type`` picks the family; ``architecture`` or else ``architectures[0]`` the model
    class (the family's default when absent). Bad input is a ``ValueError`` starting with
    ``spec.config.<field>:`` (or ``spec.architecture:``).
    """
    document = load_document(config)
    if not isinstance(architecture, str):
        raise ValueError(f"spec.architecture: must be a class name, got {architecture!r}")
    override = architecture
    if architecture:
        document["architectures"] = [architecture]
    model_type = document.get("model_type")
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    names = document.get("architectures")
    well_formed = isinstance(names, list) and names and all(isinstance(n, str) for n in names)
    # cross-attention layers are left to transformers (the built-in families do not write them out)
    fast = family is not None and document.get("add_cross_attention") is not True
    if fast and (not well_formed or names[0] in family.architectures):
        # the built-in fast path: no transformers import (tests/server/architectures/test_generic.py proves it equal)
        architecture = _architecture(document, family)
        document["architectures"] = [architecture]
        return family.build(document, architecture)
    from . import hf, meta_models, spec_cache

    return spec_cache.cached(document, override, meta_models.transformers_version(), hf.build)


def _architecture(document: Mapping[str, Any], family: Family) -> str:
    """``architectures[0]``, checked against the family's supported classes."""
    supported = ", ".join(family.architectures)
    names = document.get("architectures")
    if names is None:
        return family.architectures[0]
    if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)):
        raise invalid(
            "architectures",
            f"must be a non-empty list of class names, got {names!r}",
            f"use e.g. [{family.architectures[0]!r}]",
        )
    if names[0] not in family.architectures:
        raise invalid(
            "architectures",
            f"unsupported architecture {names[0]!r} for model_type {family.model_type!r}",
            f"use one of: {supported}",
        )
    return names[0]
