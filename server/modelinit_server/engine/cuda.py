"""GPU kernel (Triton): the bytes of :func:`.reference.generate`, bit for bit, computed on a CUDA device.

This module is the only place in the engine that uses triton and torch. ``import modelinit_server.engine``
never imports it; importing it imports triton if triton is installed (never torch: torch is imported
inside the functions that need it). :func:`available` says whether the kernel can run here.

Public API
----------
* :func:`available` -- True when triton imports and either ``torch.cuda.is_available()`` or the Triton
  interpreter is on (``TRITON_INTERPRET=1``, which runs the kernel with numpy on CPU tensors; for tests).
* :func:`generate_into` ``(out, sampler, key, start, count, dtype)`` -- writes the little-endian bytes of
  elements ``[start, start + count)`` into ``out``, a contiguous 1-D ``torch.uint8`` tensor on the
  kernel's device of exactly ``count * itemsize`` bytes (any byte offset; a misaligned ``out`` goes
  through an aligned temporary).
* :func:`generate_runs_into` ``(out, sampler, key, starts, counts, dtype)`` -- many ranges of one tensor,
  back to back, in one launch of a second kernel that reads each program's range from a table
  (:func:`run_table`) and shares the element code (``_element_bits``) with the first.
* :func:`generate_tensor` ``(sampler, key, start, count, dtype, device=None)`` -- the same as a 1-D torch
  ``float32`` / ``bfloat16`` / ``float16`` tensor.
* :func:`ptx` / :func:`ptx_problems` -- compile the kernel for a CUDA target (no GPU needed, only
  triton's bundled LLVM) and list the instructions that would break bit-identity.

Arguments are validated by :func:`.reference.check_args`, as :func:`.reference.generate_array` and the numba kernel do
(same ``ValueError`` messages, same order: sampler, key, start/count, dtype), then ``out`` is checked
(``ValueError`` naming ``out``).

The kernel
----------
One Triton program handles :data:`BLOCK` consecutive elements starting at a multiple of 4 (so that each
Philox4x32-10 call of ``docs/determinism.md`` section 5 feeds its 4 words to 4 elements); the grid
covers ``[start & ~3, start + count)`` and stores are masked to ``[start, start + count)``. All index
arithmetic is int64 (element indices up to 2**62, byte offsets beyond 2**31). Per element, exactly the
operations of the spec, in its order (``engine/scalar.py`` is the line-by-line model):

* Philox4x32-10 on the counter ``(c & 0xffffffff, c >> 32, 0, 0)``, ``c = i // 4``, written out with
  ``tl.umulhi`` and wrapping uint32 ``*``/``+`` (not ``tl.randint4x``, although it computes the same
  counters, so the bytes do not depend on triton's library code); word ``i % 4`` is element ``i``'s.
* ``u = (float64(x) + 0.5) * 2**-32``.
* AS241 (``normal_ppf``) branch-free: the central and the tail formula share one Horner pair whose
  coefficients are *selected* per element (``tl.where`` on constants, an exact operation), so every
  element runs exactly the reference's sequence of roundings for its own branch. ``log_ieee`` takes the
  frexp from the float64 bit pattern. The far-tail (``r > 5``) coefficients are only compiled in for
  ``trunc_normal``: for ``normal`` ``min(u, 1 - u) >= 2**-33`` gives ``r <= 4.8``, so that branch is
  unreachable there.
* ``trunc_normal``: host scalars ``plo``, ``pw``, ``flip``, ``a``, ``b`` from the Python
  :class:`~.sampler.Sampler` (:func:`.reference.kernel_scalars`, shared with the numba kernel; never recomputed),
  the ``U2_MAX`` guard, negation, plain-comparison bounds.
* float64 -> float32 -> bfloat16 (integer formula on the float32 bits) / float16; padding rows zeroed.

Both kernels take the same trailing arguments (``_SCALARS``, ``_CONSTEXPRS``), built once per call by
``_shared_args``. Float64 scalars (``mean``, ``std``, ``plo``, ``pw``, ``a``, ``b``, ``low``, ``high - low``,
``value``) are passed as their int64 bit patterns and bit-cast back in the kernel, so no argument is ever rounded
through float32 (the interpreter and triton's scalar typing would otherwise do that to Python floats).
Constants are ``tl.constexpr`` Python floats that meet float64 tensors, where triton materializes them as
float64 exactly; no float constant is ever combined with another constant only.

Bit-identity on real GPUs: the precautions
------------------------------------------
* **No contraction.** Every launch passes ``enable_fp_fusion=False``. Triton then emits LLVM IR without
  the ``contract`` flag, the NVPTX backend prints float64 multiplies and adds with an explicit rounding
  mode (``mul.rn.f64`` / ``add.rn.f64`` / ``sub.rn.f64``, which ``ptxas`` never fuses), and triton passes
  ``--fmad=false`` to ``ptxas``. Expected PTX: no ``fma.rn.f64`` at all.
* **Division and square root correctly rounded.** ``tl.div_rn`` / ``tl.sqrt_rn`` only accept float32 in
  triton 3.x. For float64 triton lowers ``/`` to ``div.rn.f64`` and ``tl.sqrt`` to ``sqrt.rn.f64`` (PTX
  has no approximate float64 divide or square root; ``div.full`` / ``div.approx`` / ``sqrt.approx`` exist
  for float32 only), and ptxas expands both into IEEE correctly rounded sequences. Expected PTX:
  ``div.rn.f64`` and ``sqrt.rn.f64``, no ``div.full``, ``div.approx``, ``sqrt.approx``, ``rsqrt``.
* **No transcendental functions.** No libdevice call (``__nv_*``) and no ``ex2`` / ``lg2`` / ``sin`` /
  ``cos`` / ``rcp.approx`` instruction: ``log_ieee`` is built from ``+ - * /`` and bit operations.
* **No flush-to-zero.** float64 arithmetic has no FTZ mode on NVIDIA GPUs. The conversions are
  ``cvt.rn.f32.f64`` (float64 -> float32, RNE, float32 subnormals kept) and ``cvt.rn.f16.f32``
  (float32 -> float16, RNE, float16 subnormals kept); FTZ would appear as a ``.ftz`` suffix, which triton
  does not emit (it is only set for libdevice's reflect flag, and no libdevice is linked). bfloat16 uses
  the integer formula on the float32 bits. ``soft_cvt=True`` replaces both ``cvt`` instructions with exact
  integer implementations (tested against numpy), as a fallback that depends on no conversion instruction.
* :func:`ptx_problems` checks all of this on the PTX text; the tests run it for every kind and dtype
  (compilation for ``sm_90`` works without a GPU).

Speed notes (from ptxas for sm_90, no GPU run yet): BLOCK = 1024 with 8 warps gives each thread one
Philox call and its 4 elements; 64 registers (normal) / 128 (trunc_normal), no local-memory spills, 1 KiB
of shared memory for the one layout change after the Philox interleave. The work is float64 arithmetic
(about 40 DMUL + 40 DADD per element, plus the two divisions and the square root, which ptxas expands into
DFMA-based sequences), so on GPUs with slow float64 the kernel is compute bound. Stores are scalar 16/32-bit
(``start`` is a run-time value, so triton cannot prove vector alignment); they coalesce per warp.

What the interpreter cannot show: it runs the kernel with numpy float64, which is IEEE and never fuses,
so it verifies the transcription (operation order, constants, branches, bit manipulation, indexing), not
the GPU's code generation; that part rests on the PTX inspection above and on the GPU tests.
"""
from __future__ import annotations

import os
import struct
import threading

import numpy as np

from .gpu_driver import may_have_gpu
from .reference import DTYPE_ITEMSIZE, check_args, check_runs, kernel_scalars, run_offsets, zero_range
from .philox import MAX_ELEMENTS, PHILOX_M0, PHILOX_M1, PHILOX_W0, PHILOX_W1
from .sampler import U2_MAX, Sampler
from .special import AS241_A, AS241_B, AS241_C, AS241_D, AS241_E, AS241_F, LN2_HI, LN2_LO, LOG_C, SQRT_HALF

__all__ = [
    "BLOCK",
    "NUM_WARPS",
    "available",
    "generate_into",
    "generate_runs_into",
    "generate_tensor",
    "run_table",
    "interpreting",
    "ptx",
    "ptx_problems",
    "warmup",
]

try:  # triton is optional: without it the module imports, and available() is False
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None

#: Elements per Triton program (a multiple of 4; a speed knob only, values never depend on it).
BLOCK = 1024
#: Warps per program: BLOCK / (32 * NUM_WARPS) = 4 elements, i.e. one Philox call, per thread.
NUM_WARPS = 8
#: Most programs per launch (CUDA's grid x limit is 2**31 - 1); larger ranges are split into launches.
_MAX_PROGRAMS = 1 << 30

_KIND_CODE = {"normal": 0, "trunc_normal": 1, "uniform": 2, "constant": 3}
_DTYPE_CODE = {"float32": 0, "bfloat16": 1, "float16": 2}

# The kernels' shared arguments, after each kernel's own leading ones (the range kernel: out_ptr, start,
# count; the runs kernel: out_ptr, tab_ptr): the int64 scalars _SCALARS, then the constexprs _CONSTEXPRS,
# in these orders. Triton kernels take only tensors, scalars and constexprs, and do_not_specialize does not
# reach into a tuple argument (each int in it would be specialized on its value: 1 would become a constant,
# a small one an i32, each a recompilation), so the device-side signatures (both kernels and _element_bits)
# list them flat. The host builds them once per call (_shared_args), for both launches; ptx() compiles the
# same signature, with the same options (_OPTIONS).
_SCALARS = ("k0", "k1", "p0", "p1", "p2", "p3", "p4", "p5", "zlo", "zhi")
_CONSTEXPRS = ("KIND", "FLIP", "DTYPE", "SOFT_CVT", "BLOCK")
#: Compilation options of every launch (and of :func:`ptx`): no contraction, see the module docstring.
_OPTIONS = {"num_warps": NUM_WARPS, "enable_fp_fusion": False}

# Kernel constants (tl.constexpr so that triton accepts them as globals; plain floats here, so the
# module imports without triton as well).
_constexpr = tl.constexpr if tl is not None else (lambda v: v)
_M0 = _constexpr(PHILOX_M0)
_M1 = _constexpr(PHILOX_M1)
_W0 = _constexpr(PHILOX_W0)
_W1 = _constexpr(PHILOX_W1)
_TWO_M32 = _constexpr(2.0**-32)
_U2_MAX = _constexpr(U2_MAX)
_SQRT_HALF = _constexpr(SQRT_HALF)
_LN2_HI = _constexpr(LN2_HI)
_LN2_LO = _constexpr(LN2_LO)
_LC = tuple(_constexpr(c) for c in LOG_C[1:])  # _LC[k - 1] = C_k
_LC1, _LC2, _LC3, _LC4, _LC5, _LC6, _LC7, _LC8, _LC9, _LC10 = _LC
# AS241 coefficients, highest degree first (as in special.py).
_A = _constexpr(tuple(AS241_A))
_B = _constexpr(tuple(AS241_B))
_C = _constexpr(tuple(AS241_C))
_D = _constexpr(tuple(AS241_D))
_E = _constexpr(tuple(AS241_E))
_F = _constexpr(tuple(AS241_F))


def interpreting() -> bool:
    """True when triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``), as the tests do."""
    if triton is None:
        return False
    try:
        return bool(triton.knobs.runtime.interpret)
    except AttributeError:  # pragma: no cover - older triton
        return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def available() -> bool:
    """True if the kernel can run here: triton and torch import, and CUDA is available (or the interpreter is on)."""
    if triton is None:
        return False
    if not interpreting() and not may_have_gpu():
        return False  # decided without importing torch (about a second of every CLI start)
    try:
        import torch
    except Exception:
        return False
    if interpreting():
        return True
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # pragma: no cover - broken CUDA setups
        return False


# ------------------------------------------------------------------------------------------------
# The kernel
# ------------------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _philox4x32_10(c0, c1, c2, c3, k0, k1):
        """Random123's philox4x32_R(10, ctr, key): 10 rounds, the key bumped by (W0, W1) between rounds."""
        for _ in tl.static_range(10):
            hi0 = tl.umulhi(c0, _M0)
            lo0 = c0 * _M0  # uint32: wraps, the low word of the exact product
            hi1 = tl.umulhi(c2, _M1)
            lo1 = c2 * _M1
            c0 = hi1 ^ c1 ^ k0
            c1 = lo1
            c2 = hi0 ^ c3 ^ k1
            c3 = lo0
            k0 = k0 + _W0  # uint32: mod 2**32
            k1 = k1 + _W1
        return c0, c1, c2, c3

    # normal_ppf (AS241) and log_ieee: one of the four deliberate copies of this code, each in the form its
    # compiler needs: special.py (numpy, the reference), scalar.py (plain Python, the line-by-line model),
    # cpu.py (numba) and here (Triton: branch-free, the coefficient set selected per element). The constants
    # come from special.py. tests/server/engine/test_kernel_cuda.py proves this copy equal to the reference under the
    # Triton interpreter: test_interpreter_building_blocks (_normal_ppf against special.normal_ppf, with and
    # without the far tail, deep tails included), test_interpreter_golden / test_interpreter_random_table
    # (the bytes), and test_ptx_constants_are_exact_float64 (the constants in the compiled code).
    @triton.jit
    def _log_ieee(x):
        """Section 7's log of a positive normal float64, from + - * / and the frexp bit decomposition."""
        bits = x.to(tl.int64, bitcast=True)
        e = (bits >> 52) - 1022  # frexp exponent (sign bit is 0)
        m = ((bits & 0x000FFFFFFFFFFFFF) | 0x3FE0000000000000).to(tl.float64, bitcast=True)  # in [0.5, 1)
        # Comparisons take float64 tensors: triton 3.6 rounds a scalar constant of a comparison to float32
        # (0.70710677, 0.42500001, and U2_MAX to 1.0), arithmetic keeps it float64.
        small = m < tl.full(m.shape, _SQRT_HALF, tl.float64)
        m = tl.where(small, m * 2.0, m)
        e = tl.where(small, e - 1, e)
        f = m - 1.0
        s = f / (2.0 + f)  # div.rn.f64
        s2 = s * s
        p = s2 * _LC10 + _LC9  # P = C10; P = P * s2 + C9 (each rounded separately)
        p = p * s2 + _LC8
        p = p * s2 + _LC7
        p = p * s2 + _LC6
        p = p * s2 + _LC5
        p = p * s2 + _LC4
        p = p * s2 + _LC3
        p = p * s2 + _LC2
        p = p * s2 + _LC1
        t = s2 * p
        logm = (s + s * t) * 2.0
        E = e.to(tl.float64)  # exact
        return E * _LN2_HI + (logm + E * _LN2_LO)

    @triton.jit
    def _pick(central, near, X: tl.constexpr, Y: tl.constexpr, Z: tl.constexpr, FAR: tl.constexpr):
        """Coefficient X (central region), Y (tail, r <= 5) or Z (tail, r > 5) per element, as exact float64."""
        y = tl.full(central.shape, Y, tl.float64)
        if FAR:
            y = tl.where(near, y, tl.full(central.shape, Z, tl.float64))
        return tl.where(central, tl.full(central.shape, X, tl.float64), y)

    @triton.jit
    def _horner(r, central, near, X: tl.constexpr, Y: tl.constexpr, Z: tl.constexpr, FAR: tl.constexpr):
        """H(c; r) = (((c7*r + c6)*r + ...)*r + c0) with the coefficient set chosen per element."""
        acc = _pick(central, near, X[0], Y[0], Z[0], FAR)
        for k in tl.static_range(1, 8):
            acc = acc * r + _pick(central, near, X[k], Y[k], Z[k], FAR)
        return acc

    @triton.jit
    def _normal_ppf(p, FAR: tl.constexpr):
        """AS241 PPND16 of float64 p in (0, 1), branch-free; FAR: compile in the r > 5 branch."""
        q = p - 0.5
        central = tl.abs(q) <= tl.full(q.shape, 0.425, tl.float64)
        lower = q < 0.0
        rt = tl.where(lower, p, 1.0 - p)
        rt = tl.sqrt(-_log_ieee(rt))  # sqrt.rn.f64; negation exact
        if FAR:
            near = rt <= 5.0
            rt = tl.where(near, rt - 1.6, rt - 5.0)
        else:
            near = central  # unused
            rt = rt - 1.6
        r = tl.where(central, 0.180625 - q * q, rt)
        num = _horner(r, central, near, _A, _C, _E, FAR)
        den = _horner(r, central, near, _B, _D, _F, FAR)
        num = tl.where(central, q * num, num)  # central: q * A(r)
        z = num / den  # div.rn.f64
        return tl.where(lower & (~central), -z, z)

    @triton.jit
    def _f64_to_f32_bits(v):
        """float64 -> float32 bit pattern (uint32), round to nearest even, subnormals kept, overflow -> inf."""
        d = v.to(tl.int64, bitcast=True)
        sign = (d >> 32) & 0x80000000  # bit 63 -> bit 31 (arithmetic shift, then mask)
        a = d & 0x7FFFFFFFFFFFFFFF
        E = a >> 52
        # normal float32 result (E >= 897): rebias the exponent, round off 29 mantissa bits
        n = a - (896 << 52)
        n = (n + 0x0FFFFFFF + ((n >> 29) & 1)) >> 29
        n = tl.minimum(n, 0x7F800000)
        # subnormal (or zero) result: value / 2**-149 = m * 2**(E - 926), shift by 926 - E >= 30
        m = (a & 0x000FFFFFFFFFFFFF) | 0x0010000000000000
        sh = tl.minimum(tl.maximum(926 - E, 1), 62)
        s = (m + ((tl.full(sh.shape, 1, tl.int64) << (sh - 1)) - 1) + ((m >> sh) & 1)) >> sh
        r = tl.where(E >= 897, n, s) | sign
        return r.to(tl.uint32)

    @triton.jit
    def _f32_to_f16_bits(b):
        """float32 bit pattern (uint32) -> float16 bit pattern (uint16), RNE, subnormals kept, overflow -> inf."""
        w = b.to(tl.int32, bitcast=True)
        sign = (w >> 16) & 0x8000
        a = w & 0x7FFFFFFF
        # normal float16 result (a >= 2**-14): rebias by 112, round off 13 mantissa bits
        n = a - 0x38000000
        n = (n + 0x0FFF + ((n >> 13) & 1)) >> 13
        n = tl.minimum(n, 0x7C00)
        # subnormal (or zero) result: value / 2**-24 = m * 2**(e - 126), shift by 126 - e >= 14
        m = (a & 0x007FFFFF) | 0x00800000
        sh = tl.minimum(tl.maximum(126 - (a >> 23), 1), 30)
        s = (m + ((tl.full(sh.shape, 1, tl.int32) << (sh - 1)) - 1) + ((m >> sh) & 1)) >> sh
        r = tl.where(a >= 0x38800000, n, s) | sign
        return r.to(tl.uint16)

    @triton.jit
    def _f64_param(bits):
        """A float64 kernel argument from its int64 bit pattern."""
        return bits.to(tl.int64).to(tl.float64, bitcast=True)

    @triton.jit
    def _element_bits(base, k0, k1, p0, p1, p2, p3, p4, p5, zlo, zhi,
                      KIND: tl.constexpr, FLIP: tl.constexpr, DTYPE: tl.constexpr, SOFT_CVT: tl.constexpr,
                      BLOCK: tl.constexpr):
        """(indices, output bits) of elements base ... base + BLOCK - 1 (base a multiple of 4): the
        algorithm, shared by both kernels."""
        i = base + tl.arange(0, BLOCK)  # int64 element indices
        p_mean = _f64_param(p0)
        if KIND == 3:  # constant: no random bits
            v = tl.broadcast_to(p_mean, [BLOCK])
        else:
            p_std = _f64_param(p1)
            c = (base >> 2) + tl.arange(0, BLOCK // 4)  # counters of this program
            zero = tl.zeros([BLOCK // 4], tl.uint32)
            x0, x1, x2, x3 = _philox4x32_10(
                (c & 0xFFFFFFFF).to(tl.uint32), (c >> 32).to(tl.uint32), zero, zero,
                k0.to(tl.int64).to(tl.uint32), k1.to(tl.int64).to(tl.uint32),
            )
            # element 4c + j takes word j: [x0[0], x1[0], x2[0], x3[0], x0[1], ...]
            x = tl.reshape(tl.join(tl.join(x0, x2), tl.join(x1, x3)), [BLOCK])
            u = (x.to(tl.float64) + 0.5) * _TWO_M32  # exact
            if KIND == 2:  # uniform: p_mean = low, p_std = high - low
                v = p_mean + p_std * u
            else:
                if KIND == 0:
                    z = _normal_ppf(u, False)
                else:
                    plo = _f64_param(p2)
                    pw = _f64_param(p3)
                    lo_bound = _f64_param(p4)
                    hi_bound = _f64_param(p5)
                    u2 = plo + u * pw
                    u2_max = tl.full(u2.shape, _U2_MAX, tl.float64)
                    u2 = tl.where(u2 > u2_max, u2_max, u2)
                    z = _normal_ppf(u2, True)
                    if FLIP:
                        z = -z
                    z = tl.where(z < lo_bound, lo_bound, z)  # plain comparisons: a tie keeps z
                    z = tl.where(z > hi_bound, hi_bound, z)
                v = p_mean + p_std * z
        # rounding to the output dtype (float32 first, always)
        if SOFT_CVT:
            b32 = _f64_to_f32_bits(v)
        else:
            f32 = v.to(tl.float32)  # cvt.rn.f32.f64
            b32 = f32.to(tl.uint32, bitcast=True)
        if DTYPE == 0:
            bits = b32.to(tl.int32, bitcast=True)
        elif DTYPE == 1:
            h = (b32 + 0x7FFF + ((b32 >> 16) & 1)) >> 16
            bits = h.to(tl.uint16).to(tl.int16, bitcast=True)
        else:
            if SOFT_CVT:
                bits = _f32_to_f16_bits(b32).to(tl.int16, bitcast=True)
            else:
                bits = f32.to(tl.float16).to(tl.int16, bitcast=True)  # cvt.rn.f16.f32
        zr = (i >= zlo.to(tl.int64)) & (i < zhi.to(tl.int64))
        bits = tl.where(zr, tl.zeros_like(bits), bits)  # padding row: +0.0
        return i, bits

    @triton.jit(do_not_specialize=["start", "count", *_SCALARS])
    def _modelinit_v1_kernel(
        out_ptr,
        start: tl.int64,
        count: tl.int64,
        k0: tl.int64,
        k1: tl.int64,
        p0: tl.int64,
        p1: tl.int64,
        p2: tl.int64,
        p3: tl.int64,
        p4: tl.int64,
        p5: tl.int64,
        zlo: tl.int64,
        zhi: tl.int64,
        KIND: tl.constexpr,
        FLIP: tl.constexpr,
        DTYPE: tl.constexpr,
        SOFT_CVT: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        """Elements [start, start + count) of algorithm version 1 into out_ptr[0 : count] (int32 or int16 bits).

        p0..p5 (float64 bit patterns): normal (mean, std), trunc_normal (mean, std, plo, pw, a, b),
        uniform (low, high - low), constant (value). Elements zlo <= i < zhi are +0.0 (padding row).
        """
        pid = tl.program_id(0).to(tl.int64)
        start = start.to(tl.int64)
        count = count.to(tl.int64)
        base = start - (start & 3) + pid * BLOCK  # first element of this program, a multiple of 4
        i, bits = _element_bits(base, k0, k1, p0, p1, p2, p3, p4, p5, zlo, zhi, KIND, FLIP, DTYPE, SOFT_CVT, BLOCK)
        mask = (i >= start) & (i < start + count)
        tl.store(out_ptr + (i - start), bits, mask=mask)

    @triton.jit(do_not_specialize=list(_SCALARS))
    def _modelinit_v1_runs_kernel(
        out_ptr,
        tab_ptr,
        k0: tl.int64,
        k1: tl.int64,
        p0: tl.int64,
        p1: tl.int64,
        p2: tl.int64,
        p3: tl.int64,
        p4: tl.int64,
        p5: tl.int64,
        zlo: tl.int64,
        zhi: tl.int64,
        KIND: tl.constexpr,
        FLIP: tl.constexpr,
        DTYPE: tl.constexpr,
        SOFT_CVT: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        """Many runs of one tensor, back to back in out_ptr: program p reads its row of the int64
        table (run start, run count, the run's first output element, the program's first element,
        a multiple of 4) and writes that run's elements among base ... base + BLOCK - 1."""
        row = tab_ptr + tl.program_id(0).to(tl.int64) * 4
        start = tl.load(row)
        count = tl.load(row + 1)
        off = tl.load(row + 2)
        base = tl.load(row + 3)
        i, bits = _element_bits(base, k0, k1, p0, p1, p2, p3, p4, p5, zlo, zhi, KIND, FLIP, DTYPE, SOFT_CVT, BLOCK)
        mask = (i >= start) & (i < start + count)
        tl.store(out_ptr + off + (i - start), bits, mask=mask)

    for _kernel in (_modelinit_v1_kernel, _modelinit_v1_runs_kernel):  # the launches pass _SCALARS by position
        assert tuple(_kernel.arg_names[-len(_SCALARS + _CONSTEXPRS):]) == _SCALARS + _CONSTEXPRS, _kernel
    del _kernel


# ------------------------------------------------------------------------------------------------
# Host side
# ------------------------------------------------------------------------------------------------


def _bits(x: float) -> int:
    """The binary64 bit pattern of ``x`` as a signed int64 (what the kernel bit-casts back)."""
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def _constexprs(kind: str, flip: bool, dtype: str, soft_cvt: bool, block: int) -> dict:
    """The kernels' constexprs (:data:`_CONSTEXPRS`), by name."""
    return {"KIND": _KIND_CODE[kind], "FLIP": bool(flip), "DTYPE": _DTYPE_CODE[dtype], "SOFT_CVT": bool(soft_cvt),
            "BLOCK": block}


def _shared_args(sampler: Sampler, key: tuple[int, int], dtype: str, block: int,
                 soft_cvt: bool) -> tuple[tuple[int, ...], dict]:
    """The arguments both kernels share, built once per call: the int64 scalars of :data:`_SCALARS` in
    order and the constexprs by name.

    p0..p5 are the float64 bit patterns of :func:`.reference.kernel_scalars` ``mean, std, plo, pw, a, b`` (the
    kernels read plo, pw, a, b for trunc_normal only; uniform: low, high - low; constant: value). [zlo, zhi)
    is the whole padding row (``(0, 0)``: none): the kernels compare absolute element indices."""
    ks = kernel_scalars(sampler)
    params = tuple(_bits(v) for v in (ks.mean, ks.std, ks.plo, ks.pw, ks.a, ks.b))
    zlo, zhi = zero_range(sampler, 0, MAX_ELEMENTS)
    return (key[0], key[1], *params, zlo, zhi), _constexprs(sampler.kind, ks.flip, dtype, soft_cvt, block)


def _launch(view, sampler: Sampler, key: tuple[int, int], start: int, count: int, dtype: str,
            block: int, soft_cvt: bool) -> None:
    """Run the kernel into ``view`` (int32 / int16 torch tensor of ``count`` elements)."""
    scalars, consts = _shared_args(sampler, key, dtype, block, soft_cvt)
    done = 0
    per_launch = _MAX_PROGRAMS * block - 4  # keeps the program count of a launch below the limit
    while done < count:
        n = min(count - done, per_launch)
        s = start + done
        grid = (triton.cdiv((s & 3) + n, block),)
        _modelinit_v1_kernel[grid](view[done : done + n], s, n, *scalars, **consts, **_OPTIONS)
        done += n


def _check_block(block: int | None) -> int:
    b = BLOCK if block is None else block
    if isinstance(b, bool) or not isinstance(b, int) or b < 4 or b & (b - 1):
        raise ValueError(f"block: must be a power of two >= 4, got {block!r}")
    return b


def generate_into(out, sampler: Sampler, key: tuple[int, int], start: int, count: int, dtype: str, *,
                  block: int | None = None, soft_cvt: bool = False) -> None:
    """Write the little-endian bytes of elements ``[start, start + count)`` into ``out``.

    ``out`` is a contiguous 1-D ``torch.uint8`` tensor of exactly ``count * DTYPE_ITEMSIZE[dtype]`` bytes
    on a CUDA device (a CPU tensor when the Triton interpreter is on). The bytes are exactly those of
    :func:`.reference.generate`; arguments are validated like it does (same ``ValueError`` messages), then
    ``out`` (``ValueError`` naming ``out``). The kernel is launched on the current stream of ``out``'s
    device and not synchronized.

    ``block`` (elements per Triton program, a power of two >= 4) and ``soft_cvt`` (integer float64 ->
    float32 -> float16 conversions instead of ``cvt`` instructions) change speed only, never the bytes.
    """
    key, start, count = check_args(sampler, key, start, count, dtype)
    blk = _check_block(block)
    if triton is None:
        raise RuntimeError("triton is not installed")
    import torch

    if not isinstance(out, torch.Tensor) or out.dtype != torch.uint8 or out.dim() != 1:
        raise ValueError(f"out: must be a 1-D torch.uint8 tensor, got {getattr(out, 'dtype', type(out).__name__)}")
    nbytes = count * DTYPE_ITEMSIZE[dtype]
    if out.numel() != nbytes:
        raise ValueError(f"out: must hold exactly count * itemsize = {nbytes} bytes, got {out.numel()}")
    if not out.is_contiguous():
        raise ValueError("out: must be contiguous")
    _check_device(out)
    if count == 0:
        return
    itemsize = DTYPE_ITEMSIZE[dtype]
    view_dtype = torch.int32 if itemsize == 4 else torch.int16
    if out.data_ptr() % itemsize or out.storage_offset() % itemsize:
        # misaligned for int16 / int32 stores (or not viewable as them): go through an aligned temporary
        tmp = torch.empty(nbytes, dtype=torch.uint8, device=out.device)
        _run(tmp.view(view_dtype), sampler, key, start, count, dtype, blk, soft_cvt)
        out.copy_(tmp)
        return
    _run(out.view(view_dtype), sampler, key, start, count, dtype, blk, soft_cvt)


def generate_runs_into(out, sampler: Sampler, key: tuple[int, int], starts, counts, dtype: str, *,
                       block: int | None = None, soft_cvt: bool = False) -> None:
    """Elements ``[starts[r], starts[r] + counts[r])`` of every run ``r``, back to back in run order,
    into ``out`` (as :func:`generate_into`, of ``sum(counts) * itemsize`` bytes): the bytes of one
    :func:`generate_into` per run, in one launch over a table of (run, block) programs (a column
    block of a matrix is thousands of short runs)."""
    key, _, _ = check_args(sampler, key, 0, 0, dtype)
    starts, counts = check_runs(starts, counts)
    blk = _check_block(block)
    if triton is None:
        raise RuntimeError("triton is not installed")
    import torch

    item = DTYPE_ITEMSIZE[dtype]
    total = int(counts.sum())
    if not isinstance(out, torch.Tensor) or out.dtype != torch.uint8 or out.dim() != 1:
        raise ValueError(f"out: must be a 1-D torch.uint8 tensor, got {getattr(out, 'dtype', type(out).__name__)}")
    if out.numel() != total * item:
        raise ValueError(f"out: must hold exactly sum(counts) * itemsize = {total * item} bytes, got {out.numel()}")
    if not out.is_contiguous():
        raise ValueError("out: must be contiguous")
    _check_device(out)
    if total == 0:
        return
    filled = np.flatnonzero(counts)
    if filled.size == 1:  # a whole tensor or a row-block shard: the range kernel, no program table to build
        r = int(filled[0])
        generate_into(out, sampler, key, int(starts[r]), int(counts[r]), dtype, block=blk, soft_cvt=soft_cvt)
        return
    view_dtype = torch.int32 if item == 4 else torch.int16
    if out.data_ptr() % item or out.storage_offset() % item:
        tmp = torch.empty(total * item, dtype=torch.uint8, device=out.device)
        _with_device(tmp, lambda: _launch_runs(tmp.view(view_dtype), sampler, key, starts, counts, dtype, blk, soft_cvt))
        out.copy_(tmp)
        return
    view = out.view(view_dtype)
    _with_device(view, lambda: _launch_runs(view, sampler, key, starts, counts, dtype, blk, soft_cvt))


def run_table(starts: np.ndarray, counts: np.ndarray, block: int) -> np.ndarray:
    """The runs kernel's program table: one int64 row (run start, run count, the run's first output
    element, the program's first element) per ``block`` elements of each non-empty run, the
    programs of a run starting at its start rounded down to a multiple of 4."""
    offs = run_offsets(counts)
    keep = counts > 0
    s, c, o = starts[keep], counts[keep], offs[keep]
    first = s - (s & 3)
    nprog = ((s & 3) + c + block - 1) // block
    run = np.repeat(np.arange(s.size), nprog)
    j = np.arange(int(nprog.sum()), dtype=np.int64) - np.repeat(np.cumsum(nprog) - nprog, nprog)
    return np.stack([s[run], c[run], o[run], first[run] + j * block], axis=1)


def _launch_runs(view, sampler: Sampler, key: tuple[int, int], starts: np.ndarray, counts: np.ndarray, dtype: str,
                 block: int, soft_cvt: bool) -> None:
    import torch

    scalars, consts = _shared_args(sampler, key, dtype, block, soft_cvt)
    table = torch.from_numpy(run_table(starts, counts, block)).to(view.device)
    for a in range(0, table.shape[0], _MAX_PROGRAMS):
        part = table[a : a + _MAX_PROGRAMS]
        _modelinit_v1_runs_kernel[(part.shape[0],)](view, part, *scalars, **consts, **_OPTIONS)


def _check_device(out) -> None:
    if interpreting():
        if out.device.type != "cpu":
            raise ValueError(f"out: the Triton interpreter needs a CPU tensor, got device {out.device}")
    elif out.device.type != "cuda":
        raise ValueError(f"out: must be on a CUDA device, got {out.device}")


#: Serializes launches: Triton's runtime (its compile-on-first-use cache, and its interpreter, which
#: patches module state while a kernel runs) is not safe to enter from several threads at once, and
#: the embedded job produces several files at once from several threads. A launch only enqueues the
#: kernel (the interpreter aside), so the lock is held for microseconds.
_launch_lock = threading.Lock()


def _with_device(view, launch) -> None:
    with _launch_lock:
        if interpreting():
            launch()
        else:
            import torch

            with torch.cuda.device(view.device):
                launch()


def _run(view, sampler, key, start, count, dtype, block, soft_cvt) -> None:
    _with_device(view, lambda: _launch(view, sampler, key, start, count, dtype, block, soft_cvt))


def generate_tensor(sampler: Sampler, key: tuple[int, int], start: int, count: int, dtype: str, device=None, *,
                    block: int | None = None, soft_cvt: bool = False):
    """Elements ``[start, start + count)`` as a 1-D torch tensor of ``dtype`` (``float32``, ``bfloat16``,
    ``float16``) on ``device`` (default ``"cuda"``, or ``"cpu"`` under the interpreter). Same bytes and
    same validation as :func:`generate_into`."""
    key, start, count = check_args(sampler, key, start, count, dtype)
    import torch

    if device is None:
        device = "cpu" if interpreting() else "cuda"
    out = torch.empty(count * DTYPE_ITEMSIZE[dtype], dtype=torch.uint8, device=device)
    generate_into(out, sampler, key, start, count, dtype, block=block, soft_cvt=soft_cvt)
    return out.view(getattr(torch, dtype))  # torch.float32 / torch.bfloat16 / torch.float16


def warmup(device=None) -> None:
    """Compile (or load from triton's on-disk cache) the common specializations: every kind to every dtype
    (trunc_normal with and without reflection). Does nothing if the kernel is not available."""
    if not available():
        return
    samplers = [Sampler("normal"), Sampler("trunc_normal", a=-2.0, b=2.0), Sampler("trunc_normal", a=1.0),
                Sampler("uniform"), Sampler("constant", value=1.0)]
    for s in samplers:
        for dtype in _DTYPE_CODE:
            generate_tensor(s, (0, 0), 0, 8, dtype, device)


# ------------------------------------------------------------------------------------------------
# PTX inspection (no GPU needed)
# ------------------------------------------------------------------------------------------------


def ptx(kind: str = "normal", dtype: str = "bfloat16", *, flip: bool = False, soft_cvt: bool = False,
        capability: int = 90, block: int | None = None, runs: bool = False) -> str:
    """The PTX of one specialization, compiled for ``sm_<capability>`` exactly as a launch compiles it
    (``enable_fp_fusion=False``, :data:`NUM_WARPS`). Needs triton but no GPU (triton bundles LLVM and
    ptxas). Must be called with the interpreter off."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    if interpreting():
        raise RuntimeError("ptx: the Triton interpreter is on (TRITON_INTERPRET=1); nothing to compile")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    blk = _check_block(block)
    sig = {"out_ptr": "*i32" if DTYPE_ITEMSIZE[dtype] == 4 else "*i16"}
    if runs:
        sig["tab_ptr"] = "*i64"
    for name in (_SCALARS if runs else ("start", "count", *_SCALARS)):
        sig[name] = "i64"
    consts = _constexprs(kind, flip, dtype, soft_cvt, blk)
    for name in _CONSTEXPRS:
        sig[name] = "constexpr"
    src = ASTSource(fn=_modelinit_v1_runs_kernel if runs else _modelinit_v1_kernel, signature=sig, constexprs=consts)
    compiled = triton.compile(src, target=GPUTarget("cuda", capability, 32), options=dict(_OPTIONS))
    return compiled.asm["ptx"]


def ptx_problems(text: str) -> list[str]:
    """Instructions in PTX ``text`` that would break bit-identity with the reference (empty list: none).

    Flags fused multiply-adds, approximate or non-``.rn`` float64 division / square root, float64 ``mul``
    / ``add`` / ``sub`` without an explicit ``.rn`` (ptxas may contract those), transcendental or
    approximate special-function instructions, flush-to-zero, and calls (libdevice). Whether the expected
    ``div.rn.f64`` / ``sqrt.rn.f64`` / ``cvt.rn.*`` are present is for the caller to check."""
    import re

    problems = []
    patterns = {
        r"\bfma\.[\w.]*": "fused multiply-add",
        r"\bmad\.[\w.]*f(32|64)": "fused multiply-add (mad)",
        r"\bdiv\.(full|approx)[\w.]*": "approximate division",
        r"\bdiv\.r[zmp]\.f64": "division not rounded to nearest",
        r"\bsqrt\.(approx|r[zmp])[\w.]*": "approximate or non-RNE square root",
        r"\brsqrt\.[\w.]*": "approximate reciprocal square root",
        r"\brcp\.[\w.]*": "reciprocal instruction",
        r"\b(ex2|lg2|sin|cos|tanh)\.[\w.]*": "transcendental instruction",
        r"\.ftz\b": "flush-to-zero modifier",
        r"\b(mul|add|sub)\.f64\b": "float64 arithmetic without explicit .rn (contractible by ptxas)",
        r"\bcall(\.uni)?\b": "function call (libdevice?)",
    }
    for pat, why in patterns.items():
        for hit in sorted({m.group(0) for m in re.finditer(pat, text)}):
            problems.append(f"{hit}: {why}")
    return problems
