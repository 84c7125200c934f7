"""The reference generator, which defines the bytes: (sampler, key, element range, dtype) -> values.

The same for every algorithm version: the versions differ only in the key (:mod:`.philox`).

Element ``i`` of a tensor depends only on ``(key, i, sampler, dtype)``: never on ``start``/``count``,
chunking, the device or the order of requests. Work is done in blocks of :data:`BLOCK` elements
(memory stays O(count) for the output plus O(BLOCK) of temporaries); block boundaries cannot change
any value because every step is elementwise.
"""
from __future__ import annotations

import functools
import math
import operator
from typing import NamedTuple

import numpy as np
from modelinit_wire.constants import DTYPES

from .philox import MAX_ELEMENTS, _check_key, random_bits
from .sampler import U2_MAX, Sampler
from .special import normal_ppf

__all__ = [
    "BLOCK",
    "DTYPES",
    "DTYPE_ITEMSIZE",
    "NUMPY_DTYPE",
    "SAFETENSORS_DTYPE",
    "KernelScalars",
    "check_args",
    "check_dtype",
    "generate",
    "generate_array",
    "kernel_scalars",
    "to_dtype",
    "transform",
    "uniforms",
    "zero_range",
]

DTYPE_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
SAFETENSORS_DTYPE = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
#: numpy array type generate_array returns per dtype (bfloat16: the bit patterns in uint16).
NUMPY_DTYPE = {"float32": np.dtype("<f4"), "bfloat16": np.dtype("<u2"), "float16": np.dtype("<f2")}

#: Elements per internal block (a speed / memory knob only; values never depend on it).
BLOCK = 1 << 16

_TWO_M32 = 2.0**-32


def uniforms(key: tuple[int, int], start: int, count: int) -> np.ndarray:
    """u = (x + 0.5) * 2**-32 (float64, exact, in (0, 1)) for elements [start, start + count)."""
    u = random_bits(key, start, count).astype(np.float64)
    u += 0.5
    u *= _TWO_M32
    return u


def to_dtype(v: np.ndarray, dtype: str) -> np.ndarray:
    """Round float64 values to ``dtype``: float64 -> float32 (RNE), then float32 -> bfloat16 / float16 (RNE).

    bfloat16 rounding on the float32 bit pattern: ``(bits + 0x7FFF + ((bits >> 16) & 1)) >> 16``.
    """
    f32 = v.astype(np.float32)
    if dtype == "float32":
        return f32
    if dtype == "float16":
        return f32.astype(np.float16)
    bits = f32.view(np.uint32)
    r = bits >> 16
    r &= 1
    r += bits
    r += 0x7FFF
    r >>= 16
    return r.astype(np.uint16)


def _nonfinite(out: np.ndarray, dtype: str) -> bool:
    if dtype == "bfloat16":
        return bool(np.any((out & 0x7F80) == 0x7F80))
    return not bool(np.isfinite(out).all())


def check_dtype(sampler: Sampler, dtype: str) -> None:
    """ValueError unless every value ``sampler`` can produce is finite in ``dtype`` (independent of the slice)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype: must be one of {', '.join(DTYPES)}, got {dtype!r}")
    lo, hi = sampler.support
    with np.errstate(over="ignore"):
        ends = to_dtype(np.array([lo, hi], dtype=np.float64), dtype)
    if _nonfinite(ends, dtype):
        raise ValueError(
            f"dtype: sampler {sampler.kind} values range over [{lo!r}, {hi!r}], "
            f"which overflows {dtype} (or float64)"
        )


def transform(sampler: Sampler, u: np.ndarray) -> np.ndarray:
    """Float64 values from float64 uniforms ``u`` in (0, 1) (``docs/determinism.md`` section 6, with section 7's
    ``normal_ppf``). May reuse ``u``'s memory.

    ``constant`` is not handled here (it uses no random bits).
    """
    kind = sampler.kind
    if kind == "uniform":
        u *= sampler.high - sampler.low  # t = d * u,  d = high - low
        u += sampler.low  # v = low + t
        return u
    if kind == "normal":
        z = normal_ppf(u)
    elif kind == "trunc_normal":
        plo, _, pw, flip = sampler.trunc_scalars
        u *= pw  # t = u * pw
        u += plo  # u2 = plo + t
        np.minimum(u, U2_MAX, out=u)  # never feed 1.0 to normal_ppf (unreachable thanks to the reflection; part of the spec)
        z = normal_ppf(u)
        if flip:  # sampled on [-b, -a]
            np.negative(z, out=z)
        # Guard against the last-ulp case only: z is already within [a, b] up to rounding, so this
        # never piles up mass at the bounds. Plain comparisons (no min/max), so signed zeros are kept.
        if sampler.a != -np.inf:
            np.copyto(z, sampler.a, where=z < sampler.a)
        if sampler.b != np.inf:
            np.copyto(z, sampler.b, where=z > sampler.b)
    else:
        raise ValueError(f"kind: transform does not handle {kind!r}")
    z *= sampler.std  # t = std * z
    z += sampler.mean  # v = mean + t
    return z


def _values(sampler: Sampler, key: tuple[int, int], start: int, count: int) -> np.ndarray:
    """Float64 values of elements [start, start + count), before rounding to the output dtype."""
    if sampler.kind == "constant":
        return np.full(count, sampler.value, dtype=np.float64)
    return transform(sampler, uniforms(key, start, count))


def check_runs(starts: object, counts: object) -> tuple[np.ndarray, np.ndarray]:
    """``starts`` and ``counts`` of element runs as int64 arrays, checked as ``start``/``count`` are
    (non-negative integers, ``start + count <= 2**62``; ValueError naming ``starts``/``counts``)."""
    out = []
    for name, v in (("starts", starts), ("counts", counts)):
        a = np.asarray(v)
        if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
            raise ValueError(f"{name}: must be a 1-D array of non-negative integers, got {a.dtype} of shape {a.shape}")
        if a.size and (a.min() < 0 or a.max() > MAX_ELEMENTS):
            raise ValueError(f"{name}: every value must be in [0, 2**62]")
        out.append(a.astype(np.int64, copy=False))
    s, c = out
    if s.size != c.size:
        raise ValueError(f"counts: {c.size} counts for {s.size} starts; give one count per start")
    if s.size and bool(np.any(s > MAX_ELEMENTS - c)):
        raise ValueError("counts: start + count must be <= 2**62 for every run")
    return s, c


def run_offsets(counts: np.ndarray) -> np.ndarray:
    """Where each run's elements start when the runs lie back to back: the exclusive running sum."""
    offs = np.zeros(counts.size, dtype=np.int64)
    np.cumsum(counts[:-1], out=offs[1:])
    return offs


def _check_range(start: object, count: object) -> tuple[int, int]:
    vals = []
    for name, v in (("start", start), ("count", count)):
        if isinstance(v, bool):
            raise ValueError(f"{name}: must be a non-negative integer, got {v!r}")
        try:
            iv = operator.index(v)
        except TypeError:
            raise ValueError(f"{name}: must be a non-negative integer, got {v!r}") from None
        if iv < 0:
            raise ValueError(f"{name}: must be a non-negative integer, got {iv}")
        vals.append(iv)
    if vals[0] + vals[1] > MAX_ELEMENTS:
        raise ValueError(f"count: start + count must be <= 2**62, got {vals[0] + vals[1]}")
    return vals[0], vals[1]


@functools.lru_cache(maxsize=4096)
def _dtype_ok(sampler: Sampler, dtype: str) -> bool:
    check_dtype(sampler, dtype)  # raises (and then nothing is cached) unless the sampler fits the dtype
    return True


def check_args(sampler: Sampler, key: tuple[int, int], start: int, count: int,
               dtype: str) -> tuple[tuple[int, int], int, int]:
    """The argument checks of every generator (:func:`generate_array`, the numba and the Triton kernel), in
    one order with one set of ``ValueError`` messages: sampler, key, start/count, dtype (:func:`check_dtype`).
    Returns the normalized ``(key, start, count)``."""
    if not isinstance(sampler, Sampler):
        raise ValueError(f"sampler: must be a Sampler, got {type(sampler).__name__}")
    key = _check_key(key)
    start, count = _check_range(start, count)
    if isinstance(dtype, str):
        _dtype_ok(sampler, dtype)  # ~10 us per call otherwise: it matters for many small tensors
    else:
        check_dtype(sampler, dtype)
    return key, start, count


def zero_range(sampler: Sampler, start: int, count: int) -> tuple[int, int]:
    """``[i0, i1)``: the elements of ``[start, start + count)`` in the sampler's padding row (``zero_row``,
    ``docs/determinism.md`` section 10), as absolute indices; ``(0, 0)`` when there are none."""
    if sampler.zero_row is None:
        return 0, 0
    lo = sampler.zero_row * sampler.row_size
    i0, i1 = max(lo, start), min(lo + sampler.row_size, start + count)
    return (i0, i1) if i0 < i1 else (0, 0)


class KernelScalars(NamedTuple):
    """A sampler's float64 host scalars as the numba (engine/cpu.py) and Triton (engine/cuda.py) kernels take
    them, computed here once for both: every kind with random bits is ``v = mean + std * z`` after the
    ``trunc_normal`` guards (``z = -z`` if ``flip``; ``a`` / ``b`` bounds), ``docs/determinism.md`` section 6.
    The kernels never recompute any of them (section 14, "Host scalars")."""

    mean: float
    """``mean``; ``uniform``: ``low``; ``constant``: ``value``."""
    std: float
    """``std``; ``uniform``: ``d = high - low`` (the one subtraction of the spec), with ``z = u``; ``constant``: 0.0 (unused)."""
    a: float
    """``trunc_normal``'s lower bound; -inf (no-op) for the other kinds."""
    b: float
    """``trunc_normal``'s upper bound; +inf (no-op) for the other kinds."""
    plo: float
    """``trunc_normal``'s ``plo`` (:class:`~.sampler.TruncScalars`); 0.0 (unused) for the other kinds."""
    pw: float
    """``trunc_normal``'s ``pw``; 1.0 (unused) for the other kinds."""
    flip: bool
    """``trunc_normal``'s ``flip``; False for the other kinds."""


def kernel_scalars(sampler: Sampler) -> KernelScalars:
    """The :class:`KernelScalars` of ``sampler``."""
    kind = sampler.kind
    if kind == "trunc_normal":
        plo, _, pw, flip = sampler.trunc_scalars  # host scalars, never recomputed
        return KernelScalars(sampler.mean, sampler.std, sampler.a, sampler.b, plo, pw, bool(flip))
    if kind == "uniform":  # v = low + d * u is mean + std * z with mean = low, std = d, z = u
        mean, std = sampler.low, sampler.high - sampler.low
    elif kind == "constant":
        mean, std = sampler.value, 0.0
    else:
        mean, std = sampler.mean, sampler.std
    return KernelScalars(mean, std, -math.inf, math.inf, 0.0, 1.0, False)


def generate_array(sampler: Sampler, key: tuple[int, int], start: int, count: int, dtype: str) -> np.ndarray:
    """Elements [start, start + count) of the flattened tensor as a 1-D array.

    float32 -> ``np.float32``, float16 -> ``np.float16``, bfloat16 -> ``np.uint16`` holding the bf16 bits.
    ValueError for a bad argument, or if the sampler's values do not all fit ``dtype`` (see
    :func:`check_dtype`; the decision never depends on the slice).
    """
    key, start, count = check_args(sampler, key, start, count, dtype)
    out = np.empty(count, dtype=NUMPY_DTYPE[dtype])
    for off in range(0, count, BLOCK):
        n = min(BLOCK, count - off)
        out[off : off + n] = to_dtype(_values(sampler, key, start + off, n), dtype)
    i0, i1 = zero_range(sampler, start, count)
    if i0 < i1:
        out[i0 - start : i1 - start] = 0  # +0.0 bit pattern in every dtype
    if _nonfinite(out, dtype):  # unreachable after check_dtype; a safety net, never silently emit inf/NaN
        raise ValueError(f"dtype: generated values overflow {dtype}")
    return out


def generate(sampler: Sampler, key: tuple[int, int], start: int, count: int, dtype: str) -> bytes:
    """Little-endian bytes of :func:`generate_array` (``count * DTYPE_ITEMSIZE[dtype]`` bytes)."""
    return generate_array(sampler, key, start, count, dtype).tobytes()
