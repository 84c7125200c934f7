"""Resolution: every tensor of a model to the engine :class:`Sampler` its first matching rule
gives it (:func:`resolve`), reported as a :class:`Resolved` (sampler, rule, stds, formula).

A tensor that no rule matches is an error that names it (never a silent default). Fan-based
kinds become normal / uniform samplers through :mod:`modelinit_server.core.variance_scaling`;
``recorded`` rules become the tensor's own transformers rule.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ...engine import Sampler
from ...engine.host_values import Computed
from ..tensors import ModelSpec, TensorSpec
from ..variance_scaling import nonlinearity_gain, uniform_bound, variance_scaling_std
from .formulas import formula
from .policy import Policy, rules_for
from .rules import Distribution, Rule, depth_divisor
from .truncation import check_trunc_mass, truncated_std_factor


@dataclass(frozen=True)
class Resolved:
    """A tensor's resolved init: the sampler the engine runs and what the plan reports."""

    sampler: Sampler | Computed
    rule: str
    """Name of the rule that matched."""
    init: str
    """Human-readable distribution, e.g. ``normal(mean=0, std=0.02)``."""
    std: float
    """Std of the (untruncated) distribution sampled; 0 for constants."""
    effective_std: float
    """Analytic std of the values (truncation included)."""
    formula: str = ""
    """How the std (or bound) follows from the rule and the tensor, with its numbers, e.g.
    ``kaiming_normal: std = gain/sqrt(fan_in) = sqrt(2)/sqrt(768) (gain of leaky_relu, negative_slope 0)``."""


def resolve(policy: Policy, model: ModelSpec) -> list[Resolved]:
    """Resolve every tensor of ``model`` (in order) to its sampler; ValueError names an unmatched tensor."""
    rules = rules_for(policy, model)
    out = []
    for t in model.tensors:
        rule = next((r for r in rules if r.match.selects(t)), None)
        if rule is None:
            raise ValueError(_unmatched(policy, model, t))
        out.append(_resolve_one(rule, t, model))
    return out


def _unmatched(policy: Policy, model: ModelSpec, t: TensorSpec) -> str:
    """The error for a tensor no rule matches: what the policy is, the presets that would cover
    the tensor (never the one in use), and a rule that selects it, in the policy file's form."""
    from .presets import PRESETS

    current = policy.effective_preset
    where = f"under preset {current!r} and {len(policy.rules)} rule(s) of its own" if current else \
        f"under {len(policy.rules)} rule(s) of its own and no preset"
    covering = []
    for name in PRESETS:
        if name == current:
            continue
        try:
            if any(r.match.selects(t) for r in rules_for(Policy(preset=name), model)):
                covering.append(name)
        except ValueError:  # a preset that does not apply to this model
            continue
    presets = f"presets that cover it: {', '.join(covering)}; or " if covering else "no preset covers it; "
    example = '{"match": {"names": ["%s"]}, "init": "zeros"} (or "ones", {"normal": {"std": 0.02}}, ...)' % t.name
    return (f"policy: no rule matches tensor {t.name!r} (kind={t.kind}, role={t.role}, param={t.param}) {where}; "
            f"{presets}add a rule that selects it first, e.g. {example}")


def _fans(rule: Rule, t: TensorSpec) -> tuple[int, int]:
    if t.fan_in <= 0 or t.fan_out <= 0:
        raise ValueError(f"rule {rule.name!r}: {rule.init.kind} needs fan_in/fan_out, which {t.name!r} lacks")
    return t.fan_in, t.fan_out


def _from_recorded(rule: Rule, t: TensorSpec) -> Rule:
    """The rule transformers applies to ``t``, as recorded (a ``recorded`` rule resolved for one tensor)."""
    h = t.hf_init
    if h is None:
        raise ValueError(
            f"rule {rule.name!r}: tensor {t.name!r} has no recorded transformers rule (built-in families write "
            "hf-default out as rules); give it a distribution of its own"
        )
    if h.kind == "normal":
        d = Distribution("normal", mean=h.mean, std=h.std)
    elif h.kind == "trunc_normal":
        d = Distribution("trunc_normal", mean=h.mean, std=h.std, a=h.a, b=h.b, bounds="absolute")
    elif h.kind == "uniform":
        d = Distribution("uniform", low=h.low, high=h.high)
    elif h.kind == "computed":
        d = Distribution("computed")
    else:
        d = Distribution("constant", value=h.value)
    name = rule.name if rule.name != "hf-default" else f"hf-default: {h.source}"
    return Rule(rule.match, d, zero_padding_row=h.zero_row, name=name)


def _resolve_one(rule: Rule, t: TensorSpec, model: ModelSpec) -> Resolved:
    if rule.init.kind == "recorded":
        rule = _from_recorded(rule, t)
    return dataclasses.replace(_sampled(rule, t, model), formula=formula(rule, t, model))


def _sampled(rule: Rule, t: TensorSpec, model: ModelSpec) -> Resolved:
    d = rule.init
    div = depth_divisor(rule, t, model)
    zero_row = t.padding_idx if rule.zero_padding_row else None
    row = {"zero_row": zero_row, "row_size": max(1, t.numel // t.shape[0]) if t.shape and t.shape[0] else 1}
    kind = d.kind
    if kind == "computed":
        h = t.hf_init
        if h is None or h.kind != "computed":
            raise ValueError(f"rule {rule.name!r}: init 'computed' matched {t.name!r}, whose values the model does not "
                             "compute; give it a distribution")
        return Resolved(Computed(t.name, h.source, t.numel), rule.name, f"computed: {h.source}", 0.0, 0.0)
    if kind == "constant":
        return Resolved(Sampler("constant", value=d.value, **row), rule.name, f"constant({d.value:g})", 0.0, 0.0)

    # Fan-based kinds reduce to normal / uniform with a computed std or bound.
    if kind.startswith(("xavier", "kaiming")):
        fan_in, fan_out = _fans(rule, t)
        if kind.startswith("xavier"):
            std = variance_scaling_std(fan_in, fan_out, "fan_avg", d.gain)
        else:
            std = variance_scaling_std(fan_in, fan_out, d.mode, nonlinearity_gain(d.nonlinearity, d.negative_slope))
        std /= div
        if kind.endswith("normal"):
            return Resolved(Sampler("normal", std=std, **row), rule.name, f"{kind} -> normal(mean=0, std={std:.6g})", std, std)
        bound = uniform_bound(std)
        return Resolved(
            Sampler("uniform", low=-bound, high=bound, **row), rule.name, f"{kind} -> uniform({-bound:.6g}, {bound:.6g})", std, std
        )

    if kind == "uniform":
        low, high = d.low / div, d.high / div
        std = (high - low) / math.sqrt(12.0)
        return Resolved(Sampler("uniform", low=low, high=high, **row), rule.name, f"uniform({low:.6g}, {high:.6g})", std, std)

    std = d.std / div
    if kind == "normal":
        return Resolved(
            Sampler("normal", mean=d.mean, std=std, **row), rule.name, f"normal(mean={d.mean:g}, std={std:.6g})", std, std
        )

    # trunc_normal
    if d.bounds == "sigma":
        a, b = d.a, d.b
    else:
        a, b = (d.a - d.mean) / std, (d.b - d.mean) / std
        try:  # the depth-scaled std may push absolute bounds into a tail
            check_trunc_mass(a, b, f"a={d.a:g}, b={d.b:g} (absolute, mean {d.mean:g}, std {std:.3g} at {t.name!r})")
        except ValueError as e:
            raise ValueError(f"rule {rule.name!r}: {e}") from None
    factor = truncated_std_factor(a, b)
    if d.preserve_std:
        if not factor > 0:
            raise ValueError(f"rule {rule.name!r}: init.trunc_normal.preserve_std: the interval a={a:g}, b={b:g} is too "
                             "narrow to compute its std in double precision; widen it or drop preserve_std")
        std /= factor
    desc = f"trunc_normal(mean={d.mean:g}, std={std:.6g}, a={a:g}σ, b={b:g}σ)"
    return Resolved(Sampler("trunc_normal", mean=d.mean, std=std, a=a, b=b, **row), rule.name, desc, std, std * factor)
