"""The registry entry each family module exports."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..core.tensors import ModelSpec


@dataclass(frozen=True)
class Family:
    """One HF ``model_type`` and the model classes this service can enumerate for it."""

    model_type: str
    architectures: tuple[str, ...]
    """Supported ``config.architectures[0]`` values; the first is the default."""
    build: Callable[[dict[str, Any], str], ModelSpec]
    """``build(config, architecture)``: check and complete ``config`` (which already carries
    ``model_type`` and ``architectures``) and enumerate the tensors of ``architecture``."""
