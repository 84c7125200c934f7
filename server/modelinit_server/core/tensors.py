"""What a model is made of: the tensors a spec resolves to, with the metadata policies match on.

No weights are ever materialized to build these: an architecture is enumerated from its config.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

#: Module kinds a tensor can belong to (docs/policies.md, "Kinds and roles", maps module types to them).
KINDS = (
    "linear",  # nn.Linear and GPT-2's Conv1D
    "embedding",  # nn.Embedding
    "norm",  # LayerNorm, RMSNorm and their per-family variants
    "expert",  # one MoE expert's projection (stored per expert, as the hub holds it)
    "router",  # an MoE router / gate (and its score-correction bias)
    "conv",  # nn.Conv1d/2d/3d (e.g. ViT's patch projection)
    "other",  # anything else: bare parameters (ViT cls_token), persistent buffers
)

#: Roles a tensor can play in a transformer. Policies target these (e.g. depth-scale
#: ``attn_out`` and ``mlp_out``); ``other`` is for anything without a better name.
ROLES = (
    "qkv",  # attention input projections (q, k, v, or a fused qkv)
    "attn_out",  # attention output projection (writes into the residual stream)
    "mlp_in",  # MLP input / gate / up projections
    "mlp_out",  # MLP output projection (writes into the residual stream)
    "router",  # MoE router / expert gate
    "token_embedding",
    "position_embedding",
    "token_type_embedding",
    "patch_embedding",  # vision patch projection
    "lm_head",  # output projection to the vocabulary (and its bias)
    "head_transform",  # the dense layer of an MLM head before the decoder
    "classifier",  # task heads: sequence/token classification, QA, next-sentence
    "pooler",  # BERT-style pooler dense layer
    "attn_norm",
    "mlp_norm",
    "qk_norm",  # per-head query/key norms (Qwen3, OLMo 2, Gemma 3)
    "embedding_norm",
    "final_norm",
    "head_norm",
    "other",
)

PARAMS = ("weight", "bias")


@dataclass(frozen=True)
class HfInit:
    """One tensor's init as transformers performs it, as concrete numbers (fans already applied).

    ``kind`` is ``normal`` (mean, std), ``trunc_normal`` (mean, std, absolute bounds a, b as
    ``torch.nn.init.trunc_normal_`` takes them), ``uniform`` (low, high), ``constant`` (value) or
    ``computed``: values the model's own code computes (``init.copy_`` of a formula, a draw passed
    through a function, a weight-norm magnitude), reproduced by replaying that code
    (:mod:`modelinit_server.architectures.computed`), never drawn by a rule.
    ``zero_row``: the padding row is zeroed afterwards (``padding_idx``).
    """

    kind: str
    mean: float = 0.0
    std: float = 0.0
    a: float = 0.0
    b: float = 0.0
    low: float = 0.0
    high: float = 0.0
    value: float = 0.0
    zero_row: bool = False
    source: str = ""
    """The call that set it, for plans and errors, e.g. ``init.normal_(std=0.02)``."""
    origin: str = ""
    """``computed``: the in-memory tensor (state_dict name) whose final value is stored."""

    def __post_init__(self) -> None:
        if self.kind not in ("normal", "trunc_normal", "uniform", "constant", "computed"):
            raise ValueError(f"hf_init: unknown kind {self.kind!r}")


@dataclass(frozen=True)
class TensorSpec:
    """One stored tensor of a model, as it appears in the HF ``state_dict()``."""

    name: str
    """Canonical name: the key in the HF model's ``state_dict()`` (e.g. ``model.layers.0.mlp.up_proj.weight``)."""
    shape: tuple[int, ...]
    """Shape as stored (HF GPT-2 ``Conv1D`` weights are ``[in, out]``)."""
    kind: str
    """Module kind, one of :data:`KINDS`."""
    role: str
    """Role in the architecture, one of :data:`ROLES`."""
    param: str
    """``weight`` or ``bias``."""
    layer: int | None = None
    """Transformer block index (0-based), ``None`` outside the blocks."""
    fan_in: int = 0
    """Input features of the module (``in_features`` of a Linear, ``embedding_dim`` of an
    Embedding, the normalized size of a norm). Used by fan-based rules and explain."""
    fan_out: int = 0
    """Output features of the module (``out_features`` of a Linear, ``num_embeddings`` of an Embedding)."""
    padding_idx: int | None = None
    """Row that HF zeroes at init (Embedding ``padding_idx``), ``None`` if there is none."""
    hf_init: "HfInit | None" = None
    """What transformers' own initialization does to this tensor, recorded from the model class
    (generic specs); ``None`` for built-in specs, whose hf-default rules are written by family."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("tensor name: must not be empty")
        if self.kind not in KINDS:
            raise ValueError(f"tensor {self.name!r}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.role not in ROLES:
            raise ValueError(f"tensor {self.name!r}: role {self.role!r} is not one of {', '.join(ROLES)}")
        if self.param not in PARAMS:
            raise ValueError(f"tensor {self.name!r}: param {self.param!r} is not 'weight' or 'bias'")
        if any((not isinstance(d, int)) or isinstance(d, bool) or d < 0 for d in self.shape):
            raise ValueError(f"tensor {self.name!r}: shape {list(self.shape)} must be a list of non-negative integers "
                             "(empty: a scalar, one element; a 0 makes an empty tensor, as a model with no register "
                             "tokens has)")
        if self.padding_idx is not None and not (self.shape and 0 <= self.padding_idx < self.shape[0]):
            raise ValueError(
                f"tensor {self.name!r}: padding_idx {self.padding_idx} is outside its {self.shape[0]} rows"
            )

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ModelSpec:
    """A resolved architecture: its HF config and its tensors in canonical (state_dict) order."""

    family: str
    """HF ``model_type``: bert, roberta, gpt2, llama, mistral, qwen2."""
    architecture: str
    """HF class name, ``config.architectures[0]`` (e.g. ``LlamaForCausalLM``)."""
    config: Mapping[str, Any]
    """The full HF config (written out as ``config.json``)."""
    tensors: tuple[TensorSpec, ...]
    """Stored tensors in canonical order; tied weights appear once, as HF saves them."""
    n_layers: int
    """Number of transformer blocks (depth scaling uses it)."""
    hidden_size: int
    """Model width."""
    initializer_range: float
    """``config.initializer_range`` (GPT-2/BERT/Llama default 0.02)."""
    tied: Mapping[str, str] = field(default_factory=dict)
    """Tied names that are not stored, mapped to the stored tensor they share (e.g. ``lm_head.weight``)."""
    base_model_prefix: str = ""
    """The base-model attribute of the class (``bert``, ``model``, ``transformer``), empty for a
    base class. Algorithm version 2 keys each tensor by its name with ``<prefix>.`` removed."""
    transformers_version: str = ""
    """transformers version that resolved the spec (generic path); empty for built-in specs."""
    computed: Any = field(default=None, compare=False, repr=False)
    """For tensors whose ``hf_init`` is ``computed``: ``computed(names, keyer)`` returns their float64
    values by name, ``keyer(stream)`` giving the Philox key of each random stream the replay draws
    (set by the architecture that records them; None when no tensor is computed)."""

    def __post_init__(self) -> None:
        names = [t.name for t in self.tensors]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"spec: duplicate tensor names {dup[:5]}")
        if not self.tensors:
            raise ValueError("spec: the model has no tensors")

    @property
    def numel(self) -> int:
        return sum(t.numel for t in self.tensors)
