"""Variance scaling: the std (or uniform bound) of a fan-based init from a weight's fans and a gain.

The one place this arithmetic is written; the policies' ``xavier_*`` / ``kaiming_*`` kinds and
the architectures' recorder (what transformers' ``_init_weights`` does through
``torch.nn.init``) both use it. Computed as ``torch.nn.init`` computes it, operation for
operation, because plans hash the resulting doubles::

    mode "fan_avg"  (Xavier / Glorot):   std = gain * sqrt(2 / (fan_in + fan_out))
    mode "fan_in"   (LeCun, Kaiming/He): std = gain / sqrt(fan_in)
    mode "fan_out"                       std = gain / sqrt(fan_out)
    uniform:                             bound = sqrt(3) * std   (uniform(-bound, bound) has std ``std``)

    gain (torch's ``calculate_gain``): linear, sigmoid 1; relu sqrt(2); tanh 5/3; selu 3/4;
    leaky_relu sqrt(2 / (1 + negative_slope^2)).

Named presets: :data:`XAVIER` (Glorot), :data:`LECUN`, :data:`KAIMING` (He,
torch's ``kaiming_normal_`` / ``kaiming_uniform_`` defaults), :data:`TORCH_LINEAR` (what
``nn.Linear`` / ``nn.Conv*`` ``reset_parameters`` draw: ``kaiming_uniform_(w, a=sqrt(5))``,
bound about 1 / sqrt(fan_in)).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

#: Which fan scales the variance: ``fan_avg`` is Xavier's (fan_in + fan_out) / 2.
MODES = ("fan_in", "fan_out", "fan_avg")
#: torch.nn.init.calculate_gain for the nonlinearities without a parameter.
NONLINEARITY_GAIN = {"linear": 1.0, "sigmoid": 1.0, "relu": math.sqrt(2.0), "tanh": 5.0 / 3.0, "selu": 0.75}
#: Every nonlinearity :func:`nonlinearity_gain` knows (``leaky_relu`` takes a negative slope).
NONLINEARITIES = (*NONLINEARITY_GAIN, "leaky_relu")


def nonlinearity_gain(nonlinearity: str, negative_slope: float = 0.0) -> float:
    """torch's ``calculate_gain(nonlinearity, negative_slope)``, one of :data:`NONLINEARITIES`
    (KeyError otherwise); OverflowError where ``negative_slope ** 2`` overflows."""
    if nonlinearity == "leaky_relu":
        return math.sqrt(2.0 / (1 + negative_slope**2))
    return NONLINEARITY_GAIN[nonlinearity]


def variance_scaling_std(fan_in: int, fan_out: int, mode: str = "fan_in", gain: float = 1.0) -> float:
    """The std: ``gain * sqrt(2 / (fan_in + fan_out))`` for ``fan_avg``, else ``gain / sqrt(fan)``
    with the fan ``mode`` names (see the module docstring). Fans must be positive."""
    if mode == "fan_avg":
        return gain * math.sqrt(2.0 / (fan_in + fan_out))
    if mode not in MODES:
        raise ValueError(f"variance scaling: mode {mode!r} is not one of {', '.join(MODES)}")
    return gain / math.sqrt(fan_in if mode == "fan_in" else fan_out)


def uniform_bound(std: float) -> float:
    """The bound of the uniform(-bound, bound) whose std is ``std``: sqrt(3) * std."""
    return math.sqrt(3.0) * std


@dataclass(frozen=True)
class Scaling:
    """A named variance scaling: which fan, which gain."""

    mode: str
    """One of :data:`MODES`."""
    gain: float
    """Multiplies the std (see :func:`nonlinearity_gain`)."""

    def std(self, fan_in: int, fan_out: int) -> float:
        return variance_scaling_std(fan_in, fan_out, self.mode, self.gain)

    def bound(self, fan_in: int, fan_out: int) -> float:
        return uniform_bound(self.std(fan_in, fan_out))


XAVIER = Scaling("fan_avg", 1.0)
"""Glorot & Bengio 2010: ``xavier_normal_`` / ``xavier_uniform_`` with gain 1."""
LECUN = Scaling("fan_in", nonlinearity_gain("linear"))
"""LeCun et al. 1998: std 1 / sqrt(fan_in) (``kaiming_normal_(w, nonlinearity="linear")``)."""
KAIMING = Scaling("fan_in", nonlinearity_gain("leaky_relu", 0.0))
"""He et al. 2015, torch's ``kaiming_*_`` defaults (fan_in, leaky_relu, slope 0): std sqrt(2) / sqrt(fan_in)."""
TORCH_LINEAR = Scaling("fan_in", nonlinearity_gain("leaky_relu", math.sqrt(5.0)))
"""``nn.Linear`` / ``nn.Conv*`` ``reset_parameters``: ``kaiming_uniform_(w, a=sqrt(5))``, bound about 1 / sqrt(fan_in)."""
