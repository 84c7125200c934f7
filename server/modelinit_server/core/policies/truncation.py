"""The truncated normal's numbers: whether bounds hold enough mass, and its std factor.

Used by the rules' validation, by resolution (``preserve_std``, effective stds) and by the
formula text; computed without libm so every platform gets the same double.
"""
from __future__ import annotations

import decimal
import math

from ...engine import Sampler, std_normal_cdf
from ...engine.sampler import MIN_TRUNC_MASS


def check_trunc_mass(a: float, b: float, shown: str) -> None:
    """ValueError unless N(0, 1) has at least MIN_TRUNC_MASS between ``a`` and ``b`` (sigma
    units), computed as the sampler computes it (the sampler refuses less)."""
    try:
        Sampler("trunc_normal", a=a, b=b)
    except ValueError:
        raise ValueError(
            f"init.trunc_normal: bounds {shown} hold no probability mass ({a:.4g}σ to {b:.4g}σ from the mean: less "
            f"than {MIN_TRUNC_MASS:g} of the normal lies between them); use bounds nearer the mean"
        ) from None


def truncated_std_factor(a: float, b: float) -> float:
    """Std of N(0, 1) truncated to [a, b] (a, b may be infinite):
    sqrt(1 + (a phi(a) - b phi(b)) / Z - ((phi(a) - phi(b)) / Z)^2), Z = Phi(b) - Phi(a).

    Uses no libm function (Phi and phi come correctly rounded from ``decimal``, the rest is
    IEEE arithmetic): with ``preserve_std`` the sampled std depends on it, so it must give the
    same double on every platform.
    """
    z = std_normal_cdf(b) - std_normal_cdf(a)
    pa, pb = _std_normal_pdf(a), _std_normal_pdf(b)
    xpa = 0.0 if math.isinf(a) else a * pa
    xpb = 0.0 if math.isinf(b) else b * pb
    m = (pa - pb) / z
    var = 1.0 + (xpa - xpb) / z - m * m
    return math.sqrt(max(var, 0.0))


_TWO_PI = decimal.Decimal("6.28318530717958647692528676655900576839433879875021164194989")


def _std_normal_pdf(x: float) -> float:
    """exp(-x^2 / 2) / sqrt(2 pi), correctly rounded (decimal, 40 digits)."""
    if math.isinf(x):
        return 0.0
    with decimal.localcontext() as ctx:
        ctx.prec = 40
        d = decimal.Decimal(x)
        return float((-(d * d) / 2).exp() / _TWO_PI.sqrt())
