"""The probe's findings: what its measures say about the init, in plain words with the numbers.

Each check returns a sentence or None. The thresholds are deliberately wide (an init that trains
passes them by a large margin; the failures the literature describes miss them by orders of
magnitude) and are named here so that docs/probe.md can quote them.
"""
from __future__ import annotations

import math

from .measures import LayerMeasures, ModelMeasures

#: First layer's weight-gradient norm over the last's: below this the gradient vanishes toward the input.
VANISHING = 1e-2
#: ... above this it explodes toward the input.
EXPLODING = 1e2
#: Last layer's residual std over the first's, in units of sqrt(layers): a residual stream that adds L
#: independent unit updates grows like a random walk, sqrt(L); above GROWTH·sqrt(L) activations grow
#: faster than that (each layer amplifies what it receives).
GROWTH = 2.0
#: Normalized attention entropy below this (and a largest probability above SATURATED_MAX_PROB): saturated.
SATURATED_ENTROPY = 0.1
SATURATED_MAX_PROB = 0.9
#: Initial loss further than this factor from ln(classes) (either way): far from uniform predictions
#: (a sound init starts within a few percent of it).
LOSS_FACTOR = 1.25


def findings(m: ModelMeasures) -> list[str]:
    out: list[str] = []
    if m.nonfinite:
        out.append(f"non-finite values (NaN or inf) first in the {m.nonfinite[0]}: the run would fail at step 0")
    for label, layers in _by_stack(m.layers).items():
        where = f"{label} " if label else ""
        out += [s for s in (_gradients(where, layers), _growth(where, layers), _saturation(where, layers)) if s]
    loss = _loss(m)
    if loss:
        out.append(loss)
    return out


def _by_stack(layers: tuple[LayerMeasures, ...]) -> dict[str, list[LayerMeasures]]:
    out: dict[str, list[LayerMeasures]] = {}
    for layer in layers:
        out.setdefault(layer.stack, []).append(layer)
    return out


def _gradients(where: str, layers: list[LayerMeasures]) -> str | None:
    if len(layers) < 2:
        return None
    first, last = layers[0].grad_norm, layers[-1].grad_norm
    if not (math.isfinite(first) and math.isfinite(last)) or last <= 0:
        return None
    ratio = first / last
    if ratio < VANISHING:
        low = min(range(len(layers)), key=lambda i: layers[i].grad_norm)
        return (f"{where}gradients vanish toward the input: layer 0's weight gradient is {ratio:.2g}x layer "
                f"{len(layers) - 1}'s (norms {first:.3g} vs {last:.3g}; smallest at layer {low}); the first layers "
                "would barely train")
    if ratio > EXPLODING:
        return (f"{where}gradients explode toward the input: layer 0's weight gradient is {ratio:.3g}x layer "
                f"{len(layers) - 1}'s (norms {first:.3g} vs {last:.3g})")
    return None


def _growth(where: str, layers: list[LayerMeasures]) -> str | None:
    first, last = layers[0].residual_std, layers[-1].residual_std
    if not (math.isfinite(first) and math.isfinite(last)) or first <= 0 or len(layers) < 2:
        return None
    walk = math.sqrt(len(layers))
    if last / first > GROWTH * walk:
        return (f"{where}activations grow with depth: the residual stream's std goes from {first:.3g} after layer 0 "
                f"to {last:.3g} after layer {len(layers) - 1} ({last / first:.3g}x, more than {GROWTH:g} x sqrt({len(layers)}) "
                "= a random walk of its layers' updates); output projections scaled by depth (GPT-2's 1/sqrt(2·layers)) "
                "keep it down")
    return None


def _saturation(where: str, layers: list[LayerMeasures]) -> str | None:
    hit = [x for x in layers if x.attn_entropy is not None and x.attn_max_prob is not None
           and x.attn_entropy < SATURATED_ENTROPY and x.attn_max_prob > SATURATED_MAX_PROB]
    if not hit:
        return None
    worst = min(hit, key=lambda x: x.attn_entropy or 0.0)
    return (f"{where}attention is saturated in {len(hit)} of {len(layers)} layers: at layer {worst.index} a query gives "
            f"{worst.attn_max_prob:.3g} of its weight to one key on average (entropy {worst.attn_entropy:.2g} of "
            f"uniform's, logit std {worst.attn_logit_std:.3g}); the softmax passes almost no gradient")


def _loss(m: ModelMeasures) -> str | None:
    ref = m.reference_loss
    if ref is None or ref <= 0 or not math.isfinite(m.loss):
        return None
    if m.loss > LOSS_FACTOR * ref or m.loss < ref / LOSS_FACTOR:
        logits = f" (logit std {m.logit_std:.3g})" if m.logit_std is not None else ""
        return (f"initial loss {m.loss:.4g} is far from ln(classes) = {ref:.4g}, the loss of uniform predictions"
                f"{logits}: the output layer starts confident and wrong")
    return None
