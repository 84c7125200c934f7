"""Sampler: one resolved per-tensor distribution (what the init policy decided for a tensor)."""
from __future__ import annotations

import functools
import math
import numbers
import operator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .special import normal_ppf, std_normal_cdf

__all__ = ["KINDS", "MIN_TRUNC_MASS", "U_MIN", "U_MAX", "U2_MAX", "Sampler", "TruncScalars"]

#: Sampler kinds of algorithm version 1.
KINDS = ("normal", "trunc_normal", "uniform", "constant")

#: Smallest probability mass a trunc_normal interval may hold (pw = Phi(b) - Phi(a) in float64).
MIN_TRUNC_MASS = 1e-12

#: Smallest and largest uniform: u = (x + 0.5) * 2**-32 for x = 0 and x = 2**32 - 1.
U_MIN = 2.0**-33
U_MAX = 1.0 - 2.0**-33
#: trunc_normal guard: u2 is never allowed to reach 1.0; it is lowered to the largest double below 1.
U2_MAX = 1.0 - 2.0**-53


class TruncScalars(NamedTuple):
    """Host scalars of a trunc_normal sampler, computed once in Python (float64).

    An interval whose centre is above 0 (``a + b > 0``) is sampled reflected, as [-b, -a] with
    z negated afterwards: u2 then lives near 0, where doubles are dense, instead of near 1
    (for a = 7 that is ~1e13 distinct values instead of ~1e4).
    """

    plo: float
    """Phi(lo) (0.0 when lo = -inf), where [lo, hi] = [-b, -a] if ``flip`` else [a, b]."""
    phi: float
    """Phi(hi) (1.0 when hi = +inf)."""
    pw: float
    """phi - plo, one float64 subtraction: the probability mass of the interval."""
    flip: bool
    """``a + b > 0``: negate z after the inverse CDF."""


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}: must be a real number, got {value!r}")
    v = float(value)
    if math.isnan(v):
        raise ValueError(f"{name}: must not be NaN")
    return v + 0.0  # -0.0 -> +0.0: equal samplers always give equal bytes


def _finite(name: str, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{name}: must be finite, got {value!r}")


@dataclass(frozen=True)
class Sampler:
    """One resolved per-tensor distribution. Construction validates it (``ValueError`` naming the field).

    Only the fields of its ``kind`` are used (and validated); the others are ignored. Numeric fields
    are stored as Python floats with -0.0 normalized to +0.0, so ``Sampler("normal", std=2)`` equals
    ``Sampler("normal", std=2.0)`` and equal samplers always generate identical bytes.
    """

    kind: str
    """``"normal"``, ``"trunc_normal"``, ``"uniform"`` or ``"constant"``."""
    mean: float = 0.0
    """Mean of the (untruncated) normal: ``normal`` and ``trunc_normal``. Finite."""
    std: float = 1.0
    """Standard deviation of the (untruncated) normal: ``normal`` and ``trunc_normal``. Finite and > 0."""
    a: float = -math.inf
    """``trunc_normal`` lower bound in sigma units relative to ``mean`` (values >= mean + std * a). May be -inf."""
    b: float = math.inf
    """``trunc_normal`` upper bound in sigma units relative to ``mean`` (values <= mean + std * b). May be +inf.
    ``a < b``, and ``Phi(b) - Phi(a)`` must be at least :data:`MIN_TRUNC_MASS`."""
    low: float = 0.0
    """``uniform`` lower end (inclusive). Finite."""
    high: float = 1.0
    """``uniform`` upper end (exclusive up to rounding). Finite, > ``low``, and ``high - low`` finite."""
    value: float = 0.0
    """``constant`` value (written exactly, up to rounding to the output dtype). Finite."""
    zero_row: int | None = None
    """If set, every element of this row (flat indices ``[zero_row * row_size, (zero_row + 1) * row_size)``)
    is exactly +0.0: an embedding's padding row. Must be >= 0."""
    row_size: int = 1
    """Elements per row, ``prod(shape[1:])``; only used with ``zero_row``. Must be >= 1."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind: must be one of {', '.join(KINDS)}, got {self.kind!r}")
        for f in ("mean", "std", "a", "b", "low", "high", "value"):
            object.__setattr__(self, f, _real(f, getattr(self, f)))
        if self.kind in ("normal", "trunc_normal"):
            _finite("mean", self.mean)
            if not (math.isfinite(self.std) and self.std > 0.0):
                raise ValueError(f"std: must be > 0 and finite, got {self.std!r}")
        if self.kind == "trunc_normal":
            if not self.a < self.b:
                raise ValueError(f"a: must be < b, got a={self.a!r}, b={self.b!r}")
            pw = self.trunc_scalars.pw
            if not pw >= MIN_TRUNC_MASS:
                raise ValueError(
                    f"b: the interval [a, b] = [{self.a!r}, {self.b!r}] holds probability {pw:.3g} "
                    f"< {MIN_TRUNC_MASS:g} (bounds far in one tail)"
                )
        if self.kind == "uniform":
            _finite("low", self.low)
            _finite("high", self.high)
            if not self.low < self.high:
                raise ValueError(f"high: must be > low, got low={self.low!r}, high={self.high!r}")
            if not math.isfinite(self.high - self.low):
                raise ValueError(f"high: high - low must be finite, got low={self.low!r}, high={self.high!r}")
        if self.kind == "constant":
            _finite("value", self.value)
        if self.zero_row is not None:
            zr = _index("zero_row", self.zero_row)
            if zr < 0:
                raise ValueError(f"zero_row: must be >= 0 or None, got {zr}")
            object.__setattr__(self, "zero_row", zr)
        rs = _index("row_size", self.row_size)
        if rs < 1:
            raise ValueError(f"row_size: must be >= 1, got {rs}")
        object.__setattr__(self, "row_size", rs)

    @property
    def trunc_scalars(self) -> TruncScalars:
        """``(plo, phi, pw)`` of a ``trunc_normal`` sampler (ValueError for other kinds). Cached per (a, b)."""
        if self.kind != "trunc_normal":
            raise ValueError(f"kind: trunc_scalars needs kind 'trunc_normal', got {self.kind!r}")
        return _trunc_scalars(self.a, self.b)

    @property
    def support(self) -> tuple[float, float]:
        """``(lo, hi)``: float64 values that every generated float64 value ``v`` lies between (before dtype rounding).

        Exact extremes for ``normal`` (at ``u = 2**-33`` and ``1 - 2**-33``), ``uniform`` and ``constant``;
        for ``trunc_normal`` a finite bound ``a`` / ``b`` gives ``mean + std * a`` / ``mean + std * b``
        and an infinite one the extreme that ``u = 2**-33`` / ``1 - 2**-33`` reaches. Every operation is the
        one generation does, and each is monotonic, so the bounds hold exactly.
        """
        return _support(self)


def _index(name: str, value: object) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name}: must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name}: must be an integer, got {value!r}") from None


@functools.lru_cache(maxsize=4096)
def _trunc_scalars(a: float, b: float) -> TruncScalars:
    flip = a + b > 0.0  # False for [-inf, inf] (nan) and any interval with a = -inf
    lo, hi = (-b, -a) if flip else (a, b)
    plo = 0.0 if lo == -math.inf else std_normal_cdf(lo)
    phi = 1.0 if hi == math.inf else std_normal_cdf(hi)
    return TruncScalars(plo, phi, phi - plo, flip)


def _ppf1(u: float) -> float:
    return float(normal_ppf(np.array([u], dtype=np.float64))[0])


def _trunc_u2(plo: float, pw: float, u: float) -> float:
    u2 = plo + u * pw
    return min(u2, U2_MAX)


@functools.lru_cache(maxsize=4096)
def _support(s: Sampler) -> tuple[float, float]:
    if s.kind == "constant":
        return s.value, s.value
    if s.kind == "uniform":
        d = s.high - s.low
        return s.low + d * U_MIN, s.low + d * U_MAX
    if s.kind == "normal":
        zlo, zhi = _ppf1(U_MIN), _ppf1(U_MAX)
    else:
        plo, _, pw, flip = s.trunc_scalars
        ends = sorted((-1.0 if flip else 1.0) * _ppf1(_trunc_u2(plo, pw, u)) for u in (U_MIN, U_MAX))
        zlo = s.a if math.isfinite(s.a) else ends[0]
        zhi = s.b if math.isfinite(s.b) else ends[1]
    return s.mean + s.std * zlo, s.mean + s.std * zhi
