"""What the probe measures: one forward and backward pass of a filled model, per layer.

Definitions (docs/probe.md has them with their reasons):

* ``residual_std``: std of the hidden state a layer outputs (``output_hidden_states``), over every
  element of the batch;
* ``update_ratio``: std(h_out - h_in) / std(h_in): how much the layer's branches change the
  residual stream relative to what flows in (pre-LN: the branches' sum; post-LN: after the norm);
* ``attn_branch`` / ``mlp_branch``: std of each branch's output (the output of its projection of
  role ``attn_out`` / ``mlp_out``, before it is added to the residual) over std(h_in);
* ``attn_logit_std``: per query row, the std of log p over the keys it attends (log-softmax
  differs from the logits by a per-row constant, so this is the logits' std; a probability that
  underflowed counts as float32's smallest, so a saturated row gives a lower bound), averaged;
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
    attn_branch: float | None = None
    """std of the attention branch's output (its output projection, before the residual addition)
    over std(h_in); None when the layer has no projection of role ``attn_out``."""
    mlp_branch: float | None = None
    """The same for the MLP branch (role ``mlp_out``)."""


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


#: The smallest positive float32 (a denormal): a probability that underflowed to 0 stands for a logit
#: at least ~103 below the row's largest, so a saturated row's logit std is a lower bound, never 0.
_TINY = 1.401298464324817e-45


def attention_stats(probs) -> tuple[float, float, float]:
    """(logit std, normalized entropy, mean max probability) of attention probabilities [B, H, Q, K].

    The keys a row attends: all of them, or those up to the query for a causal layer (every
    probability above the diagonal exactly 0). A probability that underflowed to 0 among them
    counts at the smallest float32, so saturation shows as a large logit std, never as 0."""
    import torch

    p = probs.detach().to(torch.float64)
    q, k = p.shape[-2], p.shape[-1]
    allowed = torch.ones(q, k, dtype=torch.bool)
    if q == k and q > 1:
        upper = torch.triu(torch.ones(q, k, dtype=torch.bool), diagonal=1)
        if bool((p[..., upper] == 0).all()):
            allowed = ~upper
    n = allowed.sum(-1).to(torch.float64)  # keys per row, [Q]
    logp = torch.where(allowed, p.clamp_min(_TINY).log(), torch.zeros_like(p))
    mean = logp.sum(-1) / n
    var = (torch.where(allowed, logp - mean.unsqueeze(-1), torch.zeros_like(p)) ** 2).sum(-1) / (n - 1).clamp_min(1)
    entropy = -torch.where(p > 0, p * p.clamp_min(_TINY).log(), torch.zeros_like(p)).sum(-1)
    several = (n > 1).expand_as(entropy)
    norm = entropy / n.log().clamp_min(1e-12)
    rows = several.sum().clamp_min(1)
    logit_std = (var.sqrt() * several).sum() / rows
    entropy_mean = (norm * several).sum() / rows
    return float(logit_std), float(entropy_mean), float(p.amax(-1).mean())


def first_nonfinite(named: list[tuple[str, Any]]) -> list[str]:
    import torch

    out = []
    for what, t in named:
        if t is not None and not bool(torch.isfinite(t.detach()).all()):
            out.append(what)
            break
    return out
