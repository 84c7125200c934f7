"""The special functions of algorithm version 1: an IEEE-only log, the AS241 inverse normal CDF,
and the exact host-side normal CDF.

``log_ieee`` and ``normal_ppf`` determine output bytes, so they use nothing but correctly rounded
IEEE-754 binary64 ``+ - * / sqrt`` (plus the exact ``frexp`` decomposition and comparisons), each
operation separately rounded, in exactly the order written here. numpy never fuses a multiply and
an add, so the vectorized code below is the reference a numba or Triton kernel must reproduce bit
for bit (with FMA contraction disabled there). ``std_normal_cdf`` runs once per sampler on the
host, in exact decimal arithmetic, so it has no libm in it either.

``log_ieee`` and ``normal_ppf`` exist in four deliberate copies, one per compiler, all tested equal to
the ones here: this module (numpy, vectorized: the reference), ``scalar.py`` (plain Python floats, one
element at a time: ``tests/server/engine/test_engine.py::test_scalar_tail_branches_agree``), ``cpu.py`` (numba:
``tests/server/engine/test_kernel_cpu.py``, through the kernel's bytes) and ``cuda.py`` (Triton:
``tests/server/engine/test_kernel_cuda.py::test_interpreter_building_blocks``, under the Triton interpreter). The
constants below are the only ones: every copy imports them from here (``tests/server/engine/test_golden.py``
pins their bits).
"""
from __future__ import annotations

import decimal
import functools
import math

import numpy as np

__all__ = [
    "AS241_A",
    "AS241_B",
    "AS241_C",
    "AS241_D",
    "AS241_E",
    "AS241_F",
    "LOG_C",
    "LN2_HI",
    "LN2_LO",
    "SQRT_HALF",
    "log_ieee",
    "normal_ppf",
    "std_normal_cdf",
    "CDF_CUTOFF",
]

# --------------------------------------------------------------------------------------------
# log_ieee
# --------------------------------------------------------------------------------------------

#: Threshold for folding the frexp mantissa into [sqrt(1/2), sqrt(2)).
SQRT_HALF = 0.70710678118654752440
#: ln 2 split in two (fdlibm): LN2_HI has 32 significant bits so ``E * LN2_HI`` is exact.
LN2_HI = 6.93147180369123816490e-01  # 0x3FE62E42FEE00000
LN2_LO = 1.90821492927058770002e-10  # 0x3DEA39EF35793C76
#: LOG_C[k] = float64(1 / (2k + 1)) for k = 1..10 (LOG_C[0] unused), each the correctly rounded quotient.
LOG_C = (None,) + tuple(1.0 / (2 * k + 1) for k in range(1, 11))

assert LN2_HI.hex() == "0x1.62e42fee00000p-1" and LN2_LO.hex() == "0x1.a39ef35793c76p-33"


# The reference copy; the others: scalar.log_ieee, cpu._log_ieee (numba), cuda._log_ieee (Triton). See the
# module docstring for the tests that prove them equal.
def log_ieee(x: np.ndarray) -> np.ndarray:
    """Natural log of positive float64 values in (0, 1] (it is accurate on any positive normal or subnormal input).

    ``(m, e) = frexp(x)``; if ``m < SQRT_HALF``: ``m = m * 2``, ``e = e - 1``; ``f = m - 1``;
    ``s = f / (2 + f)``; ``s2 = s * s``; ``P = C10``, then ``P = P * s2 + Ck`` for k = 9..1;
    ``t = s2 * P``; ``logm = (s + s * t) * 2``; ``E = float64(e)``;
    result ``= E * LN2_HI + (logm + E * LN2_LO)``. Within 2 ulp of the true log.
    """
    x = np.asarray(x, dtype=np.float64)
    m, e = np.frexp(x)
    small = m < SQRT_HALF
    m = np.where(small, m * 2.0, m)
    E = e.astype(np.float64)
    E -= small  # e - 1 where folded (exact small integers)
    f = m - 1.0
    s = f / (2.0 + f)
    s2 = s * s
    p = s2 * LOG_C[10]
    p += LOG_C[9]
    for k in range(8, 0, -1):
        p *= s2
        p += LOG_C[k]
    t = s2 * p  # t = s2 * P
    t *= s  # s * t
    t += s  # s + s * t
    t *= 2.0  # logm
    t += E * LN2_LO  # logm + E * LN2_LO
    E *= LN2_HI  # E * LN2_HI
    E += t
    return E


# --------------------------------------------------------------------------------------------
# normal_ppf: Wichura (1988), Algorithm AS241 PPND16
# --------------------------------------------------------------------------------------------

# Coefficients high degree first (index 0 is the x^7 coefficient), exactly the decimal literals
# of AS241 (and of CPython's statistics.NormalDist.inv_cdf), rounded to binary64 by the parser.
#: Central region numerator a7..a0.
AS241_A = (
    2.5090809287301226727e3,
    3.3430575583588128105e4,
    6.7265770927008700853e4,
    4.5921953931549871457e4,
    1.3731693765509461125e4,
    1.9715909503065514427e3,
    1.3314166789178437745e2,
    3.3871328727963666080e0,
)
#: Central region denominator b7..b0 (b0 = 1).
AS241_B = (
    5.2264952788528545610e3,
    2.8729085735721942674e4,
    3.9307895800092710610e4,
    2.1213794301586595867e4,
    5.3941960214247511077e3,
    6.8718700749205790830e2,
    4.2313330701600911252e1,
    1.0,
)
#: Intermediate tail (r <= 5) numerator c7..c0.
AS241_C = (
    7.74545014278341407640e-4,
    2.27238449892691845833e-2,
    2.41780725177450611770e-1,
    1.27045825245236838258e0,
    3.64784832476320460504e0,
    5.76949722146069140550e0,
    4.63033784615654529590e0,
    1.42343711074968357734e0,
)
#: Intermediate tail denominator d7..d0 (d0 = 1).
AS241_D = (
    1.05075007164441684324e-9,
    5.47593808499534494600e-4,
    1.51986665636164571966e-2,
    1.48103976427480074590e-1,
    6.89767334985100004550e-1,
    1.67638483018380384940e0,
    2.05319162663775882187e0,
    1.0,
)
#: Far tail (r > 5) numerator e7..e0.
AS241_E = (
    2.01033439929228813265e-7,
    2.71155556874348757815e-5,
    1.24266094738807843860e-3,
    2.65321895265761230930e-2,
    2.96560571828504891230e-1,
    1.78482653991729133580e0,
    5.46378491116411436990e0,
    6.65790464350110377720e0,
)
#: Far tail denominator f7..f0 (f0 = 1).
AS241_F = (
    2.04426310338993978564e-15,
    1.42151175831644588870e-7,
    1.84631831751005468180e-5,
    7.86869131145613259100e-4,
    1.48753612908506148525e-2,
    1.36929880922735805310e-1,
    5.99832206555887937690e-1,
    1.0,
)


def _horner(coefs: tuple[float, ...], r: np.ndarray) -> np.ndarray:
    """``((((c7*r + c6)*r + c5)*r + ...)*r + c0`` with every product and sum rounded separately."""
    acc = r * coefs[0]
    acc += coefs[1]
    for c in coefs[2:]:
        acc *= r
        acc += c
    return acc


# The reference copy; the others: scalar.normal_ppf, cpu._central / cpu._ppf_tails / cpu._far_tails (numba),
# cuda._normal_ppf (Triton). See the module docstring for the tests that prove them equal.
def normal_ppf(u: np.ndarray) -> np.ndarray:
    """Inverse standard normal CDF of float64 values in (0, 1) by AS241 (PPND16), vectorized.

    ``q = u - 0.5``. If ``|q| <= 0.425``: ``r = 0.180625 - q*q``, ``z = (q * A(r)) / B(r)``.
    Otherwise ``r = u`` if ``q < 0`` else ``1 - u``; ``r = sqrt(-log_ieee(r))``; if ``r <= 5``:
    ``r = r - 1.6``, ``z = C(r) / D(r)``, else ``r = r - 5``, ``z = E(r) / F(r)``; ``z = -z`` if ``q < 0``.
    Returns a new float64 array of the shape of ``u``.
    """
    u = np.asarray(u, dtype=np.float64)
    shape = u.shape
    u = u.reshape(-1)
    q = u - 0.5
    # Central formula, evaluated everywhere (cheaper than gathering 85 % of the elements);
    # the tail elements are overwritten below.
    r = q * q
    np.subtract(0.180625, r, out=r)
    z = _horner(AS241_A, r)
    z *= q  # q * num (IEEE multiplication is commutative)
    z /= _horner(AS241_B, r)
    del r
    np.abs(q, out=q)
    tail = np.flatnonzero(~(q <= 0.425))  # "not |q| <= 0.425", exactly the AS241 test
    del q
    if tail.size:
        ut = u.take(tail)
        neg = ut < 0.5  # same as q < 0: u - 0.5 rounds to a negative number iff u < 0.5
        rt = np.subtract(1.0, ut)  # 1 - u, exact for u >= 0.5
        np.copyto(rt, ut, where=neg)  # r = u where q < 0
        del ut
        rt = log_ieee(rt)
        np.negative(rt, out=rt)
        np.sqrt(rt, out=rt)
        near = rt <= 5.0
        if near.all():
            rt -= 1.6
            zt = _horner(AS241_C, rt)
            zt /= _horner(AS241_D, rt)
        else:  # only reachable for u (or 1 - u) < exp(-25), i.e. trunc_normal deep in a tail
            zt = np.empty_like(rt)
            rn = rt[near] - 1.6
            zt[near] = _horner(AS241_C, rn) / _horner(AS241_D, rn)
            far = ~near
            rf = rt[far] - 5.0
            zt[far] = _horner(AS241_E, rf) / _horner(AS241_F, rf)
        np.negative(zt, out=zt, where=neg)
        z.put(tail, zt)
    return z.reshape(shape)[()] if shape == () else z.reshape(shape)


# --------------------------------------------------------------------------------------------
# std_normal_cdf: exact on the host
# --------------------------------------------------------------------------------------------

#: |x| beyond which Phi(x) is returned as exactly 0.0 / 1.0. Phi(-38.5) < 2**-1075, so every
#: x < -CDF_CUTOFF correctly rounds to 0.0, and Phi(x) rounds to 1.0 for every x > 8.3.
CDF_CUTOFF = 38.5
#: Guard digits beyond the 17 a binary64 result needs.
_DIGITS = 60
_LN10 = 2.302585092994046  # ln 10; only sizes the working precision (no libm call anywhere here)


@functools.lru_cache(maxsize=None)
def _pi(prec: int) -> decimal.Decimal:
    """pi to ``prec`` significant digits (the series recipe of the ``decimal`` documentation)."""
    with decimal.localcontext() as ctx:
        ctx.prec = prec + 5
        D = decimal.Decimal
        lasts, t, s, n, na, d, da = D(0), D(3), D(3), 1, 0, 0, 24
        while s != lasts:
            lasts = s
            n, na = n + na, na + 8
            d, da = d + da, da + 32
            t = (t * n) / d
            s += t
        ctx.prec = prec
        return +s


def _erf_parts(y: decimal.Decimal, prec: int) -> decimal.Decimal:
    """erf(y) for y >= 0 at ``prec`` digits: 2/sqrt(pi) * exp(-y^2) * sum_n 2^n y^(2n+1) / (1*3*...*(2n+1)).

    All terms are positive, so the sum has no cancellation; it stops once a term past the largest
    one is below 10**-(prec+3) of the sum (the remaining terms then shrink geometrically).
    """
    y2 = y * y
    two_y2 = 2 * y2
    term = y
    total = y
    n = 0
    eps = decimal.Decimal(10) ** -(prec + 3)
    while True:
        n += 1
        term = term * two_y2 / (2 * n + 1)
        total += term
        if 2 * n + 1 > two_y2 * 2 and term < total * eps:
            break
    return 2 / _pi(prec).sqrt() * (-y2).exp() * total


@functools.lru_cache(maxsize=4096)
def std_normal_cdf(x: float) -> float:
    """Phi(x), the standard normal CDF, correctly rounded to float64 (platform independent: decimal only).

    ``Phi(x) = 0.5 * (1 + erf(x / sqrt(2)))``; for x < 0 computed as ``0.5 * (1 - erf(|x| / sqrt(2)))``
    at a working precision raised by the digits that the cancellation loses, so small tail values
    keep full relative accuracy. ``Phi(-inf) = 0``, ``Phi(+inf) = 1``; 0.0 / 1.0 beyond ``CDF_CUTOFF``.
    """
    x = float(x)
    if math.isnan(x):
        raise ValueError("x: must not be NaN")
    if x < -CDF_CUTOFF:
        return 0.0
    if x > CDF_CUTOFF:
        return 1.0
    if x == 0.0:
        return 0.5
    ax = abs(x)
    # Digits lost to cancellation in 1 - erf(y): about y^2 / ln(10) (erfc(y) ~ exp(-y^2)).
    extra = int(ax * ax / 2.0 / _LN10) + 2 if x < 0 else 0
    prec = _DIGITS + extra
    prec += -prec % 20  # share the cached pi between nearby precisions
    with decimal.localcontext() as ctx:
        ctx.prec = prec
        ctx.Emin = -999999
        ctx.Emax = 999999
        D = decimal.Decimal
        y = D(ax) / D(2).sqrt()  # D(ax) is the exact binary value
        erf = _erf_parts(y, prec)
        half = D(1) / 2
        p = half + half * erf if x > 0 else half - half * erf
        return float(p)
