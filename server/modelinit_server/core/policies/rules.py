"""The rule language: :class:`Match` (which tensors), :class:`Distribution` (what they get) and
:class:`Rule` (the two, with modifiers), each validated at construction.

A rule's fan-based kinds (``xavier_*``, ``kaiming_*``) follow :mod:`modelinit_server.core.variance_scaling`;
:func:`depth_divisor` is what a rule's ``depth_scaling`` divides a std by.
"""
from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass

from modelinit_wire.quoting import quote

from ..tensors import KINDS, PARAMS, ROLES, ModelSpec, TensorSpec
from ..variance_scaling import NONLINEARITIES, nonlinearity_gain
from .truncation import check_trunc_mass

DISTRIBUTIONS = (
    "normal",
    "trunc_normal",
    "uniform",
    "constant",
    "xavier_uniform",
    "xavier_normal",
    "kaiming_uniform",
    "kaiming_normal",
    "recorded",
    "computed",
)
DEPTH_SCALINGS = ("none", "n_layers", "layer")
#: Most values in one of a Match's lists (kinds, roles, params, names).
MAX_MATCH_VALUES = 256
#: Longest ``names`` glob (tensor names are far shorter).
MAX_GLOB_CHARS = 1024
#: Longest rule name.
MAX_RULE_NAME_CHARS = 200


@dataclass(frozen=True)
class Match:
    """Selects tensors: every non-empty field must match; within a field any value may."""

    kinds: tuple[str, ...] = ()
    """Module kinds (``linear``, ``embedding``, ``norm``); empty: any."""
    roles: tuple[str, ...] = ()
    """Roles (see :data:`modelinit_server.core.tensors.ROLES`); empty: any."""
    params: tuple[str, ...] = ()
    """``weight`` / ``bias``; empty: any."""
    names: tuple[str, ...] = ()
    """fnmatch globs on the tensor name (``*`` crosses dots); empty: any."""
    min_layer: int | None = None
    """Lowest block index matched (inclusive); tensors outside blocks never match a layer range."""
    max_layer: int | None = None
    """Highest block index matched (inclusive)."""

    def __post_init__(self) -> None:
        for label, values in (("kinds", self.kinds), ("roles", self.roles), ("params", self.params), ("names", self.names)):
            if len(values) > MAX_MATCH_VALUES:
                raise ValueError(f"match.{label}: {len(values)} values, more than {MAX_MATCH_VALUES}; split the rule")
        for label, values, allowed in (("kinds", self.kinds, KINDS), ("roles", self.roles, ROLES), ("params", self.params, PARAMS)):
            bad = [v for v in values if v not in allowed]
            if bad:
                raise ValueError(f"match.{label}: unknown {quote(bad[0])}; use one of: {', '.join(allowed)}")
        for i, glob in enumerate(self.names):
            if not isinstance(glob, str):
                raise ValueError(f"match.names[{i}]: must be a glob (a string), got {quote(glob)}")
            if len(glob) > MAX_GLOB_CHARS:
                raise ValueError(f"match.names[{i}]: a glob of {len(glob):,} characters ({quote(glob)}), "
                                 f"longer than {MAX_GLOB_CHARS}; tensor names are far shorter")
        if self.min_layer is not None and self.max_layer is not None and self.min_layer > self.max_layer:
            raise ValueError(f"match.min_layer: {self.min_layer} is above max_layer {self.max_layer}")
        # Compiled here, held by this Match: fnmatch's own pattern cache (32,768 entries) would
        # keep every request's globs alive in the server; re's cache is bounded (512 patterns).
        object.__setattr__(self, "_globs", tuple(re.compile(fnmatch.translate(g)).match for g in self.names))

    def selects(self, t: TensorSpec) -> bool:
        if self.kinds and t.kind not in self.kinds:
            return False
        if self.roles and t.role not in self.roles:
            return False
        if self.params and t.param not in self.params:
            return False
        if self.names and not any(match(t.name) for match in self._globs):  # fnmatch.fnmatchcase
            return False
        if self.min_layer is not None or self.max_layer is not None:
            if t.layer is None:
                return False
            if self.min_layer is not None and t.layer < self.min_layer:
                return False
            if self.max_layer is not None and t.layer > self.max_layer:
                return False
        return True


@dataclass(frozen=True)
class Distribution:
    """A distribution before it meets a tensor (fan-based kinds need the tensor's fans).

    Formulas (fan = fan_in, fan_out, or their mean for Xavier):
    ``xavier_normal``: std = gain * sqrt(2 / (fan_in + fan_out));
    ``xavier_uniform``: bound = gain * sqrt(6 / (fan_in + fan_out));
    ``kaiming_normal``: std = g / sqrt(fan); ``kaiming_uniform``: bound = g * sqrt(3 / fan), with
    g = torch's ``calculate_gain(nonlinearity, negative_slope)``; computed by
    :mod:`modelinit_server.core.variance_scaling`.
    """

    kind: str
    """One of :data:`DISTRIBUTIONS`. ``recorded``: the tensor's own transformers rule
    (``TensorSpec.hf_init``, learned from the model class; see docs/policies.md). ``computed``: the
    values the model's own code computes for the tensor (only for tensors whose recorded rule is
    ``computed``: SSM ``A_log`` / ``dt_bias``, sinusoidal tables, weight-norm magnitudes)."""
    mean: float = 0.0
    """normal / trunc_normal mean."""
    std: float = 0.0
    """normal / trunc_normal std (of the untruncated normal unless ``preserve_std``)."""
    a: float = -2.0
    """trunc_normal lower bound (sigma units or absolute, see ``bounds``)."""
    b: float = 2.0
    """trunc_normal upper bound."""
    bounds: str = "sigma"
    """``sigma``: a, b in std units around the mean (TF); ``absolute``: values (torch)."""
    preserve_std: bool = False
    """trunc_normal: divide std by the truncation's std factor so the result has std ``std``."""
    low: float = 0.0
    """uniform lower bound."""
    high: float = 0.0
    """uniform upper bound."""
    value: float = 0.0
    """constant value."""
    gain: float = 1.0
    """Xavier gain."""
    negative_slope: float = 0.0
    """Kaiming leaky-ReLU slope."""
    mode: str = "fan_in"
    """Kaiming fan: ``fan_in`` or ``fan_out``."""
    nonlinearity: str = "leaky_relu"
    """Kaiming nonlinearity (torch's default for kaiming_* is ``leaky_relu`` with slope 0)."""

    def __post_init__(self) -> None:
        k = self.kind
        if k not in DISTRIBUTIONS:
            raise ValueError(f"init: unknown distribution {k!r}; use one of: {', '.join(DISTRIBUTIONS)}")
        for fname in ("mean", "std", "a", "b", "low", "high", "value", "gain", "negative_slope"):
            v = getattr(self, fname)
            if math.isnan(v) or (math.isinf(v) and fname not in ("a", "b")):
                raise ValueError(f"init.{k}.{fname}: must be a finite number, got {v}")
        if k in ("normal", "trunc_normal") and not self.std > 0:
            raise ValueError(f"init.{k}.std: must be > 0, got {self.std}")
        if k == "trunc_normal":
            if self.bounds not in ("sigma", "absolute"):
                raise ValueError(f"init.trunc_normal.bounds: {quote(self.bounds)} is not 'sigma' or 'absolute'")
            if not self.a < self.b:
                raise ValueError(f"init.trunc_normal: lower bound a={self.a} must be below b={self.b}")
            if self.preserve_std and self.bounds != "sigma":
                raise ValueError("init.trunc_normal.preserve_std: needs bounds='sigma' (absolute bounds move with the std)")
            if self.bounds == "sigma":
                check_trunc_mass(self.a, self.b, f"a={self.a:g}, b={self.b:g}")
            else:  # at this std; a rule's depth scaling may shrink it further (checked per tensor)
                check_trunc_mass((self.a - self.mean) / self.std, (self.b - self.mean) / self.std,
                                  f"a={self.a:g}, b={self.b:g} (absolute, mean {self.mean:g}, std {self.std:g})")
        if k == "uniform" and not self.low < self.high:
            raise ValueError(f"init.uniform: low={self.low} must be below high={self.high}")
        if k == "uniform" and not math.isfinite(self.high - self.low):
            raise ValueError(f"init.uniform: high - low = {self.high:g} - {self.low:g} overflows a double; use a narrower range")
        if k.startswith("xavier") and not self.gain > 0:
            raise ValueError(f"init.{k}.gain: must be > 0, got {self.gain}")
        if k.startswith("kaiming"):
            if self.mode not in ("fan_in", "fan_out"):
                raise ValueError(f"init.{k}.mode: {quote(self.mode)} is not 'fan_in' or 'fan_out'")
            if self.nonlinearity not in NONLINEARITIES:
                raise ValueError(
                    f"init.{k}.nonlinearity: unknown {quote(self.nonlinearity)}; use one of: {', '.join(NONLINEARITIES)}"
                )
            try:
                nonlinearity_gain(self.nonlinearity, self.negative_slope)
            except OverflowError:
                raise ValueError(
                    f"init.{k}.negative_slope: {self.negative_slope:g} is too large: its square overflows the gain "
                    "sqrt(2 / (1 + negative_slope^2)); use a slope below 1e150 in magnitude"
                ) from None


@dataclass(frozen=True)
class Rule:
    """One policy rule: which tensors, which distribution, which modifiers."""

    match: Match
    """Tensors this rule selects."""
    init: Distribution
    """Their distribution."""
    depth_scaling: str = "none"
    """``none``; ``n_layers``: std / sqrt(2 * n_layers) (GPT-2, Megatron); ``layer``: std / sqrt(2 * (layer + 1)) (torchtitan)."""
    zero_padding_row: bool = False
    """Zero the embedding's padding row (HF ``padding_idx``)."""
    name: str = ""
    """Shown in plans and errors; empty: ``rule[<index>]``."""

    def __post_init__(self) -> None:
        if len(self.name) > MAX_RULE_NAME_CHARS:
            raise ValueError(f"name: {len(self.name):,} characters ({quote(self.name)}), longer than {MAX_RULE_NAME_CHARS}")
        if self.depth_scaling not in DEPTH_SCALINGS:
            raise ValueError(f"rule {self.name!r}: depth_scaling {self.depth_scaling!r} is not one of {', '.join(DEPTH_SCALINGS)}")
        if self.depth_scaling != "none" and self.init.kind in ("constant", "recorded", "computed"):
            raise ValueError(f"rule {self.name!r}: depth_scaling does not apply to a constant")


def depth_divisor(rule: Rule, t: TensorSpec, model: ModelSpec) -> float:
    """What ``rule.depth_scaling`` divides the std (or bounds) of tensor ``t`` by."""
    if rule.depth_scaling == "n_layers":
        return math.sqrt(2.0 * model.n_layers)
    if rule.depth_scaling == "layer":
        if t.layer is None:
            raise ValueError(f"rule {rule.name!r}: depth_scaling 'layer' matched {t.name!r}, which is outside the blocks")
        return math.sqrt(2.0 * (t.layer + 1))
    return 1.0

