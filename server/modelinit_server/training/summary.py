"""What :func:`~modelinit_server.training.init_module_` reports: :class:`InitSummary`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class InitSummary:
    """What :func:`~modelinit_server.training.init_module_` did."""

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
