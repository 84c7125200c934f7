"""The formula text ``explain`` shows beside each group: how a rule's std (or bounds) follows from
the rule and the tensor, with the numbers put in (``Resolved.formula``), e.g.
``kaiming_normal: std = gain/sqrt(fan_in) = sqrt(2)/sqrt(768) (gain of leaky_relu, negative_slope 0)``.
"""
from __future__ import annotations

from ..tensors import ModelSpec, TensorSpec
from .rules import Rule, depth_divisor
from .truncation import truncated_std_factor

_GAIN_TEXT = {"linear": "1", "sigmoid": "1", "relu": "sqrt(2)", "tanh": "5/3", "selu": "3/4"}


def formula(rule: Rule, t: TensorSpec, model: ModelSpec) -> str:
    """The formula of ``rule``'s std (or bounds) for tensor ``t``, with the numbers put in:
    what ``explain`` shows beside each group (``rule`` already resolved from ``recorded``)."""
    d, kind = rule.init, rule.init.kind
    if rule.depth_scaling == "n_layers":
        depth = ("/sqrt(2·n_layers)", f"/sqrt(2·{model.n_layers})")
    elif rule.depth_scaling == "layer" and t.layer is not None:
        depth = ("/sqrt(2·(layer+1))", f"/sqrt(2·{t.layer + 1})")
    else:
        depth = ("", "")

    def wrap(x: str) -> str:
        return f"({x})" if any(c in x for c in "/·") else x

    def scaled(name: str, symbolic: str, numeric: str) -> str:
        if depth[0]:
            symbolic, numeric = wrap(symbolic) + depth[0], wrap(numeric) + depth[1]
        return f"{kind}: {name} = {symbolic}" + (f" = {numeric}" if numeric != symbolic else "")

    if kind == "constant":
        return f"constant: value = {d.value:g}"
    if kind == "computed":
        source = t.hf_init.source if t.hf_init is not None else ""
        return f"computed on the host by the model's own code ({source})"
    if kind == "normal":
        return scaled("std", f"{d.std:g}", f"{d.std:g}")
    if kind == "uniform":
        return scaled("[low, high]", f"[{d.low:g}, {d.high:g}]", f"[{d.low:g}, {d.high:g}]")
    if kind == "trunc_normal":
        std = d.std / depth_divisor(rule, t, model)
        if d.bounds == "sigma":
            a, b = d.a, d.b
            bounds = f"a={a:g}σ, b={b:g}σ"
        else:
            a, b = (d.a - d.mean) / std, (d.b - d.mean) / std
            bounds = f"a={d.a:g}, b={d.b:g} absolute (a={a:.6g}σ, b={b:.6g}σ)"
        factor = truncated_std_factor(a, b)
        out = scaled("std", f"{d.std:g}", f"{d.std:g}") + f", {bounds}"
        return out + (f", std/{factor:.6g} (preserve_std)" if d.preserve_std else f", eff. std = std·{factor:.6g}")
    if t.fan_in <= 0 or t.fan_out <= 0:
        return f"{kind}: needs fan_in/fan_out"
    if kind.startswith("xavier"):
        n = 2 if kind == "xavier_normal" else 6
        name = "std" if kind == "xavier_normal" else "bound"
        return scaled(name, f"gain·sqrt({n}/(fan_in+fan_out))", f"{d.gain:g}·sqrt({n}/({t.fan_in}+{t.fan_out}))")
    # kaiming
    if d.nonlinearity == "leaky_relu":
        gain = "sqrt(2)" if d.negative_slope == 0 else f"sqrt(2/(1+{d.negative_slope:g}²))"
        act = f"leaky_relu, negative_slope {d.negative_slope:g}"
    else:
        gain, act = _GAIN_TEXT.get(d.nonlinearity, "?"), d.nonlinearity
    fan = d.mode
    fan_value = t.fan_in if fan == "fan_in" else t.fan_out
    if kind == "kaiming_normal":
        out = scaled("std", f"gain/sqrt({fan})", f"{gain}/sqrt({fan_value})")
    else:
        out = scaled("bound", f"gain·sqrt(3/{fan})", f"{gain}·sqrt(3/{fan_value})")
    return f"{out} (gain of {act})"
