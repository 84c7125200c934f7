"""Tensor builders for the torch modules the supported architectures are made of.

Each builder returns the tensors one module registers, in its registration order (``weight``
before ``bias``), named ``<prefix>.weight`` / ``<prefix>.bias`` as ``state_dict()`` names them.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from ..core.tensors import ModelSpec, TensorSpec


def linear(
    prefix: str, fan_in: int, fan_out: int, role: str, layer: int | None = None, bias: bool = True
) -> list[TensorSpec]:
    """``nn.Linear(fan_in, fan_out)``: weight ``[out, in]``, bias ``[out]``."""
    meta = dict(kind="linear", role=role, layer=layer, fan_in=fan_in, fan_out=fan_out)
    tensors = [TensorSpec(f"{prefix}.weight", (fan_out, fan_in), param="weight", **meta)]
    if bias:
        tensors.append(TensorSpec(f"{prefix}.bias", (fan_out,), param="bias", **meta))
    return tensors


def conv1d(prefix: str, fan_in: int, fan_out: int, role: str, layer: int) -> list[TensorSpec]:
    """GPT-2 ``Conv1D(fan_out, fan_in)``: a linear layer stored transposed, weight ``[in, out]``."""
    meta = dict(kind="linear", role=role, layer=layer, fan_in=fan_in, fan_out=fan_out)
    return [
        TensorSpec(f"{prefix}.weight", (fan_in, fan_out), param="weight", **meta),
        TensorSpec(f"{prefix}.bias", (fan_out,), param="bias", **meta),
    ]


def embedding(prefix: str, rows: int, dim: int, role: str, padding_idx: int | None = None) -> list[TensorSpec]:
    """``nn.Embedding(rows, dim, padding_idx)``: weight ``[rows, dim]``."""
    return [
        TensorSpec(
            f"{prefix}.weight",
            (rows, dim),
            kind="embedding",
            role=role,
            param="weight",
            fan_in=dim,
            fan_out=rows,
            padding_idx=padding_idx,
        )
    ]


def norm(prefix: str, size: int, role: str, layer: int | None = None, bias: bool = True) -> list[TensorSpec]:
    """``nn.LayerNorm(size)`` (weight and bias) or an RMSNorm (``bias=False``: weight only)."""
    meta = dict(kind="norm", role=role, layer=layer, fan_in=size, fan_out=size)
    tensors = [TensorSpec(f"{prefix}.weight", (size,), param="weight", **meta)]
    if bias:
        tensors.append(TensorSpec(f"{prefix}.bias", (size,), param="bias", **meta))
    return tensors


def output_bias(name: str, hidden: int, vocab: int) -> list[TensorSpec]:
    """The bare ``nn.Parameter(torch.zeros(vocab))`` of an MLM head, the bias of its decoder."""
    return [
        TensorSpec(name, (vocab,), kind="linear", role="lm_head", param="bias", fan_in=hidden, fan_out=vocab)
    ]


def assemble(
    *,
    family: str,
    architecture: str,
    config: Mapping[str, Any],
    state_dict: Iterable[TensorSpec],
    tied: Mapping[str, str],
    n_layers: int,
    hidden_size: int,
    base_model_prefix: str = "",
) -> ModelSpec:
    """Build the spec from the model's full ``state_dict()`` listing.

    ``tied`` maps each tied name to the tensor it shares (HF ``_tied_weights_keys``, already
    emptied when ``tie_word_embeddings`` is false). ``save_pretrained`` drops the tied names, so
    they are left out of the stored tensors and recorded in ``ModelSpec.tied``.
    ``base_model_prefix`` is the HF class's base-model attribute when the class wraps the base
    model (``bert``, ``transformer``, ``model``), empty for a base class.
    """
    return ModelSpec(
        family=family,
        architecture=architecture,
        config=dict(sorted(config.items())),  # sorted like HF's config.json
        tensors=tuple(t for t in state_dict if t.name not in tied),
        n_layers=n_layers,
        hidden_size=hidden_size,
        initializer_range=config["initializer_range"],
        tied=dict(tied),
        base_model_prefix=base_model_prefix,
    )
