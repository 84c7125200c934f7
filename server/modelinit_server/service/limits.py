"""What one server agrees to build: operator-set caps on a request's size, checked on the plan.

The architectures already refuse what no model needs (dimensions over 2^31, more than 10,000
layers, over 10^13 parameters); these caps are the operator's tighter choice for one deployment,
so a request for a 400B model cannot tie up a node sized for 8B ones. They are on by default, set
well above every published model (the largest presets: deepseek-v3, 671B parameters in ~45,400
tensors; vocabularies up to ~262k), so that a typo (a hidden size of 819200) is refused at once
instead of streaming terabytes. Sizes are Python integers: no arithmetic here can overflow.
"""
from __future__ import annotations

from dataclasses import dataclass

from modelinit_wire.constants import (  # the defaults, shared with the client's `serve` flags
    DEFAULT_MAX_DIM,
    DEFAULT_MAX_PARAMS,
    DEFAULT_MAX_RANK,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_TENSORS,
)

from ..core.planner import Plan


@dataclass(frozen=True)
class Limits:
    """Caps on a request; ``0`` means no cap beyond the built-in ones."""

    max_params: int = DEFAULT_MAX_PARAMS
    """Largest total number of parameters (``--max-params``)."""
    max_dim: int = DEFAULT_MAX_DIM
    """Largest size of any tensor dimension (``--max-dim``)."""
    max_rank: int = DEFAULT_MAX_RANK
    """Most dimensions of any tensor (``--max-rank``)."""
    max_tensors: int = DEFAULT_MAX_TENSORS
    """Most tensors in one model (``--max-tensors``)."""
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    """Largest serialized request the server accepts, in bytes (``--max-request-bytes``); gRPC
    itself answers RESOURCE_EXHAUSTED beyond it, before any parsing."""

    def __post_init__(self) -> None:
        for name in ("max_params", "max_dim", "max_rank", "max_tensors"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: must be an integer >= 0 (0: no cap), got {value!r}")
        if not isinstance(self.max_request_bytes, int) or not 1024 <= self.max_request_bytes <= 1 << 30:
            raise ValueError(f"max_request_bytes: must be between 1024 and 2^30, got {self.max_request_bytes!r}")

    def check(self, plan: Plan) -> None:
        """ValueError naming the tensor and the cap when the plan is over one."""
        tensors = plan.tensors
        if self.max_tensors and len(tensors) > self.max_tensors:
            raise ValueError(
                f"spec: {len(tensors)} tensors is more than this server's limit of {self.max_tensors} (--max-tensors); "
                "use fewer layers or a server configured for larger models"
            )
        for t in tensors:
            shape = t.spec.shape
            if self.max_rank and len(shape) > self.max_rank:
                raise ValueError(f"spec: tensor {t.spec.name!r} has {len(shape)} dimensions, over this server's limit of {self.max_rank} (--max-rank)")
            if self.max_dim and shape and max(shape) > self.max_dim:
                raise ValueError(
                    f"spec: tensor {t.spec.name!r} has shape {list(shape)}, a dimension over this server's limit of "
                    f"{self.max_dim} (--max-dim); reduce the config's sizes"
                )
        params = plan.total_params
        if self.max_params and params > self.max_params:
            raise ValueError(
                f"spec: {params:,} parameters is more than this server's limit of {self.max_params:,} (--max-params); "
                "use a smaller model or a server configured for larger ones"
            )
