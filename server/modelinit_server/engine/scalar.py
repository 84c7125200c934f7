"""Algorithm version 1, one element at a time, in plain Python floats (IEEE binary64, no numpy).

A literal transcription of ``docs/determinism.md``, kept as simple as possible: it is the model a
scalar kernel (numba, Triton, C) should follow line by line, and the tests check that the vectorized
reference in :mod:`.reference` gives the same bytes. Python floats round every operation separately and
never fuse, and ``math.frexp`` / ``math.sqrt`` are exact / correctly rounded, so this is exactly the
arithmetic the spec prescribes. Far too slow for real use (about 10 microseconds per element).

``log_ieee`` / ``normal_ppf`` here are one of four deliberate copies (see ``special.py``'s docstring):
``special.py`` (numpy, the reference), this one, ``cpu.py`` (numba) and ``cuda.py`` (Triton), with the
constants of ``special.py`` only. ``tests/server/engine/test_engine.py`` proves this copy equal to the reference
(``test_scalar_tail_branches_agree``: both functions, deep tails; ``test_vectorized_equals_scalar_transcription``:
whole elements, every kind and dtype).
"""
from __future__ import annotations

import math
import struct

from .philox import PHILOX_M0, PHILOX_M1, PHILOX_W0, PHILOX_W1
from .sampler import U2_MAX, Sampler
from .special import AS241_A, AS241_B, AS241_C, AS241_D, AS241_E, AS241_F, LN2_HI, LN2_LO, LOG_C, SQRT_HALF

__all__ = ["element_bits", "element_value", "element_bytes"]

M32 = 0xFFFFFFFF


def philox(c0: int, c1: int, c2: int, c3: int, k0: int, k1: int) -> tuple[int, int, int, int]:
    for _ in range(10):
        p0 = PHILOX_M0 * c0
        p1 = PHILOX_M1 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & M32, (p0 >> 32) ^ c3 ^ k1, p0 & M32
        k0 = (k0 + PHILOX_W0) & M32
        k1 = (k1 + PHILOX_W1) & M32
    return c0, c1, c2, c3


def element_bits(key: tuple[int, int], i: int) -> int:
    c = i // 4
    return philox(c & M32, c >> 32, 0, 0, key[0], key[1])[i % 4]


# Copies: special.log_ieee (the reference), cpu._log_ieee, cuda._log_ieee.
def log_ieee(x: float) -> float:
    m, e = math.frexp(x)
    if m < SQRT_HALF:
        m = m * 2.0
        e = e - 1
    f = m - 1.0
    s = f / (2.0 + f)
    s2 = s * s
    p = LOG_C[10]
    for k in range(9, 0, -1):
        p = p * s2 + LOG_C[k]
    t = s2 * p
    logm = (s + s * t) * 2.0
    E = float(e)
    return E * LN2_HI + (logm + E * LN2_LO)


def horner(c: tuple[float, ...], r: float) -> float:
    acc = c[0]
    for ck in c[1:]:
        acc = acc * r + ck
    return acc


# Copies: special.normal_ppf (the reference), cpu._central / _ppf_tails / _far_tails, cuda._normal_ppf.
def normal_ppf(u: float) -> float:
    q = u - 0.5
    if abs(q) <= 0.425:
        r = 0.180625 - q * q
        return (q * horner(AS241_A, r)) / horner(AS241_B, r)
    r = u if q < 0.0 else 1.0 - u
    r = math.sqrt(-log_ieee(r))
    if r <= 5.0:
        r = r - 1.6
        z = horner(AS241_C, r) / horner(AS241_D, r)
    else:
        r = r - 5.0
        z = horner(AS241_E, r) / horner(AS241_F, r)
    return -z if q < 0.0 else z


def element_value(s: Sampler, key: tuple[int, int], i: int) -> float:
    """The float64 value of element i before rounding to the output dtype (zero rows not applied)."""
    if s.kind == "constant":
        return s.value
    x = element_bits(key, i)
    u = (float(x) + 0.5) * 2.0**-32
    if s.kind == "uniform":
        d = s.high - s.low
        return s.low + d * u
    if s.kind == "normal":
        z = normal_ppf(u)
    else:
        plo, _, pw, flip = s.trunc_scalars
        u2 = plo + u * pw
        if u2 > U2_MAX:
            u2 = U2_MAX
        z = normal_ppf(u2)
        if flip:
            z = -z
        if z < s.a:
            z = s.a
        if z > s.b:
            z = s.b
    return s.mean + s.std * z


def element_bytes(s: Sampler, key: tuple[int, int], i: int, dtype: str) -> bytes:
    """The little-endian bytes of element i in ``dtype``."""
    if s.zero_row is not None and s.zero_row * s.row_size <= i < (s.zero_row + 1) * s.row_size:
        return b"\x00" * (4 if dtype == "float32" else 2)
    v = element_value(s, key, i)
    f32 = struct.pack("<f", v)  # float64 -> float32, round to nearest even (OverflowError beyond range)
    if dtype == "float32":
        return f32
    if dtype == "float16":
        return struct.pack("<e", struct.unpack("<f", f32)[0])  # float32 -> float16, RNE
    bits = struct.unpack("<I", f32)[0]
    return struct.pack("<H", (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16)
