"""Explain a plan: tensors grouped by (rule, init, shape), compared with the Xavier and LeCun
reference stds, with warnings for inits that are likely to break training.

Pure core (no grpc): :func:`explain` takes a :class:`~modelinit_server.core.planner.Plan`; the
servicer puts the groups in ``PlanResponse.groups`` (see :mod:`modelinit_server.messages`).
docs/policies.md ("explain") documents the columns and the warnings.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..engine import Sampler, std_normal_cdf
from ..engine.host_values import Computed
from .planner import Plan, TensorPlan
from .variance_scaling import LECUN, XAVIER

#: |mean| above this many effective stds counts as a non-zero mean.
MEAN_TOLERANCE = 0.1
#: Truncation bounds at least this many sigma out remove a fraction < 2e-9 of the mass: a no-op.
NO_TRUNCATION_SIGMA = 6.0
#: effective_std / lecun_std outside [LOW, HIGH] for a Linear weight is "far from fan-in".
LECUN_RATIO_LOW = 0.1
LECUN_RATIO_HIGH = 4.0


@dataclass(frozen=True)
class Group:
    """Tensors that share a rule, a resolved distribution, a shape, a module kind and a param."""

    rule: str
    """Name of the rule that matched every tensor of the group."""
    init: str
    """The resolved distribution, human readable (as in the plan), e.g. ``normal(mean=0, std=0.02)``."""
    formula: str
    """How the rule gives this std, with the group's numbers, e.g.
    ``kaiming_normal: std = gain/sqrt(fan_in) = sqrt(2)/sqrt(768) (gain of leaky_relu, negative_slope 0)``."""
    kind: str
    """Module kind: ``linear``, ``embedding`` or ``norm``."""
    param: str
    """``weight`` or ``bias``."""
    roles: tuple[str, ...]
    """Roles present in the group, in first-appearance order."""
    shape: tuple[int, ...]
    """Shape of each tensor."""
    example: str
    """Name of the group's first tensor (to find it in the plan)."""
    count: int
    """Number of tensors."""
    params: int
    """Total elements over the group's tensors."""
    std: float
    """Nominal std of the sampled distribution (the untruncated normal's for trunc_normal); 0 for constants."""
    effective_std: float
    """Analytic std of the values, truncation included; 0 for constants."""
    mean: float
    """Analytic mean of the values: the (truncated) normal's, (low + high) / 2, or the constant."""
    fan_in: int
    """Input features of the module (0 when it has none)."""
    fan_out: int
    """Output features of the module (0 when it has none)."""
    xavier_std: float
    """sqrt(2 / (fan_in + fan_out)); 0 when not applicable (norms, biases, constants, no fans)."""
    lecun_std: float
    """1 / sqrt(fan_in); 0 when not applicable."""
    ratio_xavier: float
    """effective_std / xavier_std; 0 when not applicable."""
    ratio_lecun: float
    """effective_std / lecun_std; 0 when not applicable."""
    warnings: tuple[str, ...]
    """Why this init is likely to hurt training; empty when nothing looks wrong."""


def explain(plan: Plan) -> list[Group]:
    """Group the plan's tensors by (rule, init, shape, kind, param), in first-appearance order."""
    buckets: dict[tuple, list[TensorPlan]] = {}
    for t in plan.tensors:
        key = (t.resolved.rule, t.resolved.init, t.spec.shape, t.spec.kind, t.spec.param)
        buckets.setdefault(key, []).append(t)
    return [_group(members) for members in buckets.values()]


def _group(members: list[TensorPlan]) -> Group:
    first = members[0]
    s, r = first.spec, first.resolved
    mean = distribution_mean(r.sampler)
    if r.sampler.kind == "computed":  # what the model's code computed: its measured std stands for the rule's
        r = replace(r, effective_std=_computed_std(r.sampler))
    xavier, lecun = _references(first)
    fields = dict(
        rule=r.rule,
        init=r.init,
        formula=r.formula,
        kind=s.kind,
        param=s.param,
        roles=tuple(dict.fromkeys(m.spec.role for m in members)),
        shape=s.shape,
        example=s.name,
        count=len(members),
        params=sum(m.spec.numel for m in members),
        std=r.std,
        effective_std=r.effective_std,
        mean=mean,
        fan_in=s.fan_in,
        fan_out=s.fan_out,
        xavier_std=xavier,
        lecun_std=lecun,
        ratio_xavier=r.effective_std / xavier if xavier else 0.0,
        ratio_lecun=r.effective_std / lecun if lecun else 0.0,
    )
    return Group(**fields, warnings=_warnings(first, mean, fields["ratio_lecun"]))


def _references(t: TensorPlan) -> tuple[float, float]:
    """(Xavier std, LeCun std) of a random Linear/Embedding weight; (0, 0) where they mean nothing."""
    s = t.spec
    random_weight = s.param == "weight" and s.kind != "norm" and t.sampler.kind not in ("constant", "computed")
    if not random_weight or s.fan_in <= 0 or s.fan_out <= 0:
        return 0.0, 0.0
    return XAVIER.std(s.fan_in, s.fan_out), LECUN.std(s.fan_in, s.fan_out)


def _computed_values(d: Computed):
    import numpy as np

    if d.values is None:
        return np.zeros(0)
    v = np.asarray(d.values(), dtype=np.float64)
    return v[np.isfinite(v)]


def _computed_std(d: Computed) -> float:
    v = _computed_values(d)
    return float(v.std()) if v.size else 0.0


def distribution_mean(d: Sampler | Computed) -> float:
    """Analytic mean of the values a sampler draws (the padding row, if any, is ignored); the
    measured mean of the finite values of a computed tensor (0 before it is bound to a seed)."""
    if isinstance(d, Computed):
        v = _computed_values(d)
        return float(v.mean()) if v.size else 0.0
    if d.kind == "constant":
        return d.value
    if d.kind == "uniform":
        return (d.low + d.high) / 2.0
    if d.kind == "normal":
        return d.mean
    # Truncated normal: mean + std * (phi(a) - phi(b)) / (Phi(b) - Phi(a)), a and b in sigma units.
    z = std_normal_cdf(d.b) - std_normal_cdf(d.a)
    return d.mean + d.std * (_pdf(d.a) - _pdf(d.b)) / z


def _pdf(x: float) -> float:
    return 0.0 if math.isinf(x) else math.exp(-x * x / 2.0) / math.sqrt(2.0 * math.pi)


# --- warnings ----------------------------------------------------------------------------------
# Each check looks at the group's first tensor (all members share kind, param and distribution)
# and returns a sentence saying what is off and why it matters, or None.


def _warnings(t: TensorPlan, mean: float, ratio_lecun: float) -> tuple[str, ...]:
    if t.sampler.kind == "computed":  # the model's own formula (A_log, dt_bias, a sinusoid): deliberate
        return ()
    checks = (
        _nonzero_mean(t, mean),
        _no_truncation(t),
        _far_from_fan_in(t, ratio_lecun),
        _norm_not_one(t),
        _bias_not_zero(t),
    )
    return tuple(w for w in checks if w)


def _nonzero_mean(t: TensorPlan, mean: float) -> str | None:
    s, eff = t.spec, t.resolved.effective_std
    if s.param != "weight" or s.kind == "norm" or abs(mean) <= MEAN_TOLERANCE * eff:
        return None
    spread = f" ({mean / eff:.2g}σ)" if eff else ""
    return (f"non-zero mean {mean:.4g}{spread}: every unit gets the same shift, activations drift with depth "
            "(uniform(0, 1) is the torch.rand re-init that gives NaN loss)")


def _no_truncation(t: TensorPlan) -> str | None:
    d = t.sampler
    if d.kind != "trunc_normal" or d.a > -NO_TRUNCATION_SIGMA or d.b < NO_TRUNCATION_SIGMA:
        return None
    where = f"±{d.b:g}σ" if d.a == -d.b else f"[{d.a:g}σ, {d.b:g}σ]"
    return (f"truncation bounds at {where} truncate nothing, so this is a plain normal (as trunc_normal_(std=0.02) "
            "with torch's default a=-2, b=2 truncates nothing); use sigma bounds to truncate at ±2σ")


def _far_from_fan_in(t: TensorPlan, ratio: float) -> str | None:
    # Linear only: embedding std conventions differ (N(0, 1) token embeddings in torchtitan are deliberate).
    if t.spec.kind != "linear" or not ratio or LECUN_RATIO_LOW <= ratio <= LECUN_RATIO_HIGH:
        return None
    effect = "activations grow" if ratio > LECUN_RATIO_HIGH else "the signal shrinks"
    return (f"effective std is {ratio:.3g}x the fan-in reference 1/sqrt({t.spec.fan_in}): "
            f"{effect} by about that factor per layer")


def _norm_not_one(t: TensorPlan) -> str | None:
    d = t.sampler
    if t.spec.kind != "norm" or t.spec.param != "weight" or (d.kind == "constant" and d.value == 1.0):
        return None
    return "norm weight is not constant 1: the norm rescales every feature from the first step instead of starting as identity"


def _bias_not_zero(t: TensorPlan) -> str | None:
    d = t.sampler
    if t.spec.param != "bias" or (d.kind == "constant" and d.value == 0.0):
        return None
    return "bias is not 0: it shifts every output from the first step (biases usually start at 0)"
