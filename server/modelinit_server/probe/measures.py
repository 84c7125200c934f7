"""What the probe measures: one forward and backward pass of a filled model, per layer.

Definitions (docs/probe.md has them with their reasons):

* ``residual_std``: std of the hidden state a layer outputs (``output_hidden_states``), over every
  element of the batch;
* ``update_ratio``: std(h_out - h_in) / std(h_in): how much the layer's branches change the
  residual stream relative to what flows in (pre-LN: the branches' sum; post-LN: after the norm);
* ``attn_logit_std``: per query row, the std of log p over the keys it attends (log-softmax
  differs from the logits by a per-row constant, so this is the logits' std), averaged over rows;
* ``attn_entropy``: per row, the softmax entropy divided by log(number of keys attended), averaged
  (1: uniform attention; near 0: saturated, one key takes everything); ``attn_max_prob``: the
  average largest probability of a row;
* ``grad_norm``: the L2 norm of the gradient of every weight of the layer (parameters under
  ``<stack>.<i>.``); ``hidden_grad_std``: std of the loss gradient reaching the layer's output.

Everything is computed in float64 from the float32 model, deterministically (one thread order
per op on the CPU: the same request gives the same numbers).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LayerMeasures:
    """One transformer block of one stack (``encoder``, ``decoder`` or the model's only stack)."""

    stack: str
    index: int
    residual_std: float
    update_ratio: float
    grad_norm: float
    hidden_grad_std: float
    attn_logit_std: float | None = None
    attn_entropy: float | None = None
    attn_max_prob: float | None = None


@dataclass(frozen=True)
class ModelMeasures:
    """The whole pass."""

    loss: float
    """The model's own loss on the synthetic batch (cross-entropy for LM and classification heads)."""
    reference_loss: float | None
    """ln(number of classes): the loss of uniform predictions (None without a classifying head)."""
    logit_std: float | None
    """Std of the output logits (None without logits)."""
    embedding_std: float
    """Std of the hidden state entering the first layer."""
    layers: tuple[LayerMeasures, ...] = field(default_factory=tuple)
    nonfinite: tuple[str, ...] = ()
    """Where non-finite values appeared first (``loss``, ``logits``, ``decoder layer 3 residual``, ...)."""


def tensor_std(t) -> float:
    import torch

    x = t.detach().to(torch.float64).reshape(-1)
    if x.numel() < 2:
        return 0.0
    v = x.std().item()
    return v if math.isfinite(v) else float("nan")


def attention_stats(probs) -> tuple[float, float, float]:
    """(logit std, normalized entropy, mean max probability) of attention probabilities [B, H, Q, K]."""
    import torch

    p = probs.detach().to(torch.float64)
    keys = (p > 0).sum(-1)  # keys a row attends (a causal or padding mask leaves exact zeros)
    logp = torch.where(p > 0, p.clamp_min(1e-300).log(), torch.zeros_like(p))
    n = keys.clamp_min(1).to(torch.float64)
    mean = logp.sum(-1) / n
    var = (torch.where(p > 0, (logp - mean.unsqueeze(-1)) ** 2, torch.zeros_like(p))).sum(-1) / (n - 1).clamp_min(1)
    entropy = -(p * logp).sum(-1)
    several = keys > 1
    norm = torch.where(several, entropy / n.log().clamp_min(1e-12), torch.ones_like(entropy))
    rows = several.sum().clamp_min(1)
    logit_std = (var.sqrt() * several).sum() / rows
    return float(logit_std), float((norm * several).sum() / rows), float(p.amax(-1).mean())


def first_nonfinite(named: list[tuple[str, Any]]) -> list[str]:
    import torch

    out = []
    for what, t in named:
        if t is not None and not bool(torch.isfinite(t.detach()).all()):
            out.append(what)
            break
    return out
