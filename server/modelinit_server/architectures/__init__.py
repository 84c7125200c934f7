"""Architectures: resolve a preset or an HF ``config.json`` into the exact tensors of its model.

Pure Python: nothing is materialized. Tensor names, order and shapes are those of the HF model
class ``config.architectures[0]`` (transformers 5.23) as ``save_pretrained`` stores it: tied
weights appear once (the other names are in ``ModelSpec.tied``) and non-persistent buffers not at
all. The returned ``ModelSpec.config`` is the complete config (transformers' defaults and
derivations filled in) to write as ``config.json``; it carries no dtype.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..tensors import ModelSpec
from . import bert, gpt2, llama
from ._family import Family
from ._fields import invalid, load_document
from .presets import PRESETS

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
        raise ValueError(f"spec.preset: unknown preset {name!r}; use one of: {', '.join(PRESETS)}")
    return from_config(PRESETS[name], architecture)  # from_config works on a copy


def from_config(config: Mapping[str, Any] | str, architecture: str = "") -> ModelSpec:
    """The spec of an HF config, given as a mapping or as ``config.json`` text.

    ``model_type`` picks the family; ``architecture`` or else ``architectures[0]`` the model
    class (the family's default when absent). Bad input is a ``ValueError`` starting with
    ``spec.config.<field>:`` (or ``spec.architecture:``).
    """
    document = load_document(config)
    if architecture:
        document["architectures"] = [architecture]
    family = _family(document)
    architecture = _architecture(document, family)
    document["architectures"] = [architecture]
    return family.build(document, architecture)


def _family(document: Mapping[str, Any]) -> Family:
    supported = ", ".join(FAMILIES)
    if "model_type" not in document:
        raise invalid("model_type", "missing", f"set it to one of: {supported}")
    model_type = document["model_type"]
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise invalid("model_type", f"unsupported model type {model_type!r}", f"use one of: {supported}")
    return FAMILIES[model_type]


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
