"""Fast CPU kernel (numba): the bytes of :func:`.reference.generate`, bit for bit, several times faster.

numba is imported by this module only, so ``import modelinit_server.engine`` never needs it; importing
this module without numba works too and :func:`available` then says ``False``.

The kernel follows ``docs/determinism.md`` (algorithm version 1) operation by operation. Every float64
``+ - * /`` and ``sqrt`` is one separately rounded IEEE operation in the reference's order: ``fastmath``
is off, so LLVM may neither contract a multiply and an add into an FMA nor reassociate (the tests check
the machine code for FMA instructions). ``frexp`` is a bit operation, Philox multiplies 32-bit words
exactly in ``uint64`` and wraps its key additions to 32 bits, and the host scalars (``plo``, ``pw``,
``flip``, ``high - low``) come from the Python :class:`~.sampler.Sampler` through :func:`.reference.kernel_scalars`
(shared with the Triton kernel): nothing is recomputed here. Arguments are checked by :func:`.reference.check_args`,
as :func:`.reference.generate_array` does.

Work is split into blocks of :data:`BLOCK` elements; the parallel kernel hands contiguous ranges of
blocks to numba's threads (``prange``, dynamic scheduling), each with its own scratch arrays; calls of
up to :data:`SERIAL_MAX` elements run on the calling thread. Per block:

1. Philox4x32-10, one call per 4 elements: ``u = (x + 0.5) * 2**-32`` into a float64 scratch array.
2. AS241's central formula for *every* element, branch-free so that LLVM vectorizes it
   (``trunc_normal`` first maps ``u`` to ``u2 = min(plo + u * pw, U2_MAX)`` in the same loop).
3. The elements with ``not |q| <= 0.425`` (about 15 % for ``normal``) are listed, 8 at a time, by a
   vector compress (:func:`_tails8`) on AVX-512, one at a time by a branch-free loop elsewhere; the tail formula (``log_ieee``, ``sqrt``, the ``r <= 5``
   rational function) runs vectorized over that list; the ``r > 5`` ones (only reachable deep in a
   ``trunc_normal`` tail) are redone with the far-tail function; the results are scattered back.
4. ``trunc_normal``'s negation if ``flip`` and its two bound guards, ``mean + std * z`` (``uniform``:
   ``low + d * u``), float64 -> float32 (RNE), and the bfloat16 / float16 bit patterns by integer
   arithmetic (float16 subnormals by an exact float32 addition), stored little-endian, in one loop.

``constant`` (no random bits) and padding rows are filled by plain numpy. Overflow is refused up front
by :func:`.reference.check_dtype`, exactly as in the reference, so no non-finite value can be produced.

Speed (``benchmarks/engine_cpu.py``, bfloat16): on a 2-core AMD EPYC Zen 5 VM (AVX-512) about 720 M
elements/s for ``normal`` and ``trunc_normal`` on one thread and 1300+ on two; on a 2-core AVX2 EPYC VM
about 195 per thread (there float64 vectors are half as wide, the tail listing is a scalar loop and the
central formula's 33 float64 operations per element, with no FMA allowed, set the pace). The numpy
reference does 70.

Compilation: the kernels are compiled on first use (about 5 s on 2 cores, holding the GIL) or loaded from
numba's on-disk cache (about 0.3 s); :func:`warmup` does it up front. The cache lives in ``__pycache__``
next to this file or, when that is not writable, in the user-wide cache directory (``~/.cache/numba``);
``$NUMBA_CACHE_DIR`` overrides both. Cached code is keyed by CPU model and features, numba version and
this file's contents only (the constants imported from ``special`` / ``philox`` / ``sampler`` are frozen
into it; they belong to algorithm version 1 and never change). With no writable location, or when
writing the cache fails, the kernels are compiled in memory (with a warning) instead of failing.

Threads: ``threads=`` per call, else numba's per-thread setting (default ``NUMBA_NUM_THREADS``, which
this module sets, when it is unset, to the usable cores: the CPU affinity capped by a cgroup quota,
which numba's own default ignores).
Parallel launches are serialized by a lock, so concurrent callers are safe with every numba
threading layer. The GIL is released while a kernel runs.
"""
from __future__ import annotations

import os
import sys
import threading
import warnings

import numpy as np

from .reference import DTYPE_ITEMSIZE, check_args, check_runs, kernel_scalars, run_offsets, to_dtype, zero_range
from modelinit_host.usable_cores import usable_cores
from .philox import PHILOX_M0, PHILOX_M1, PHILOX_W0, PHILOX_W1
from .sampler import U2_MAX, Sampler
from .special import AS241_A, AS241_B, AS241_C, AS241_D, AS241_E, AS241_F, LN2_HI, LN2_LO, LOG_C, SQRT_HALF

__all__ = ["BLOCK", "available", "generate", "generate_into", "generate_runs_into", "threads", "warmup"]

#: Elements per block. A speed knob only: values never depend on it.
BLOCK = 4096
#: Up to this many elements the serial kernel runs (no thread-pool launch).
SERIAL_MAX = 4 * BLOCK
#: prange iterations per thread (each allocates its scratch once and runs a contiguous range of blocks;
#: threads take them one at a time, so a thread slowed down by other load takes fewer).
CHUNKS_PER_THREAD = 16

#: The numba options of every kernel function (tests compile uncached copies with them to inspect the asm).
JIT_OPTIONS = dict(fastmath=False, error_model="numpy", nogil=True)

_DTYPE_CODE = {"float32": 0, "bfloat16": 1, "float16": 2}
_KIND_CODE = {"normal": 0, "trunc_normal": 1, "uniform": 2}
_OUT_VIEW = {"float32": np.uint32, "bfloat16": np.uint16, "float16": np.uint16}

# libgomp (numba's "omp" threading layer) spins idle workers for a while after every parallel
# region by default; between our segments that spinning steals the cores the writer and the
# hasher need (measured: a 2.2 GB write went from 2.1 s to 5.5 s). Sleep instead; a user's own
# setting wins. Must be set before the OpenMP runtime loads (the first parallel launch).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# numba's default pool is every core of the CPU affinity, whatever a container's CPU limit (a cgroup
# quota): on a 64-core node under a 4-CPU limit, 64 threads that only get throttled. A user's own
# NUMBA_NUM_THREADS wins; read by numba at its import (no effect if it was imported before this module).
os.environ.setdefault("NUMBA_NUM_THREADS", str(usable_cores()))

try:  # numba is optional: the numpy reference works without it
    import numba as _numba
    from llvmlite import binding as _llvm
    from llvmlite import ir as _ir
    from numba.core import cgutils as _cgutils
    from numba.core import types as _types
    from numba.extending import intrinsic as _intrinsic

    _LLVM_OK = tuple(_llvm.llvm_version_info) >= (19,)
except Exception:  # pragma: no cover - only where numba is not installed (or broken)
    _numba = None
    _LLVM_OK = False

def _has_vector_compress() -> bool:
    """Whether numba compiles for a CPU with a vector compress instruction (x86 AVX-512F)."""
    try:
        name = _numba.config.CPU_NAME or "host"
        features = _llvm.get_host_cpu_features() if name == "host" else {}
        return bool(features.get("avx512f", False)) and "-avx512f" not in (_numba.config.CPU_FEATURES or "")
    except Exception:  # pragma: no cover - numba missing or an unusual llvmlite
        return False


_VECTOR_COMPRESS = _has_vector_compress() if _numba is not None else False

#: Serializes parallel launches: numba's workqueue threading layer must not be entered from two
#: threads at once, and two concurrent launches would oversubscribe the cores anyway.
_launch_lock = threading.Lock()


def available() -> bool:
    """True if the numba kernel can be used here: numba importable (with an LLVM >= 19, which has
    ``llvm.experimental.vector.compress``) on a little-endian host."""
    return _numba is not None and _LLVM_OK and sys.byteorder == "little"


def _jit(cache: bool = True, **opts):
    """``numba.njit`` with the options every kernel function needs.

    ``fastmath=False`` (no FMA contraction, no reassociation, IEEE semantics), ``error_model="numpy"``
    (a float division is a plain ``div``: Python's zero-division check would stop vectorization; no
    divisor here can be zero), ``nogil=True`` and, for the kernels, ``cache=True``. numba raises at
    decoration time when it finds no writable cache location (package directory read-only, no writable
    user cache directory, no ``NUMBA_CACHE_DIR``): then the function is compiled in memory, with a warning.
    """
    opts = dict(JIT_OPTIONS, **opts)

    def deco(fn):
        if cache:
            try:
                return _numba.njit(cache=True, **opts)(fn)
            except RuntimeError as e:  # "cannot cache function ...: no locator available for file ..."
                warnings.warn(f"modelinit: no writable numba cache location ({e}); compiling in memory", stacklevel=2)
        return _numba.njit(**opts)(fn)

    return deco


def _helper():
    """Decorator of the inlined building blocks (not cached on their own: they are part of the kernels)."""
    return _jit(cache=False, inline="always")


if available():
    # -- exact bit casts --------------------------------------------------------------------------
    @_intrinsic
    def _f64_bits(typingctx, x):
        if x != _types.float64:
            return None

        def codegen(context, builder, sig, args):
            return builder.bitcast(args[0], _ir.IntType(64))

        return _types.uint64(_types.float64), codegen

    @_intrinsic
    def _bits_f64(typingctx, x):
        if x != _types.uint64:
            return None

        def codegen(context, builder, sig, args):
            return builder.bitcast(args[0], _ir.DoubleType())

        return _types.float64(_types.uint64), codegen

    @_intrinsic
    def _f32_bits(typingctx, x):
        if x != _types.float32:
            return None

        def codegen(context, builder, sig, args):
            return builder.zext(builder.bitcast(args[0], _ir.IntType(32)), _ir.IntType(64))

        return _types.uint64(_types.float32), codegen

    @_intrinsic
    def _bits_f32(typingctx, x):
        if x != _types.uint64:
            return None

        def codegen(context, builder, sig, args):
            return builder.bitcast(builder.trunc(args[0], _ir.IntType(32)), _ir.FloatType())

        return _types.float32(_types.uint64), codegen

    def _make_put(width):
        @_intrinsic
        def put(typingctx, out, i, v):
            """out[width * i : width * (i + 1)] = the low ``width`` bytes of v, little-endian, at any alignment
            (out: a uint8 array; a plain store, so consecutive calls in a loop vectorize)."""
            if not (isinstance(out, _types.Array) and out.dtype == _types.uint8 and out.layout == "C"
                    and isinstance(i, _types.Integer) and isinstance(v, _types.Integer)):
                return None

            def codegen(context, builder, sig, args):
                o_arr = context.make_array(sig.args[0])(context, builder, args[0])
                ity = _ir.IntType(8 * width)
                pos = builder.mul(context.cast(builder, args[1], sig.args[1], _types.intp),
                                  _ir.Constant(_ir.IntType(64), width))
                ptr = builder.bitcast(builder.gep(o_arr.data, [pos]), ity.as_pointer())
                val = context.cast(builder, args[2], sig.args[2], _types.uint64)
                builder.store(builder.trunc(val, ity) if width < 8 else val, ptr, align=1)
                return context.get_dummy_value()

            return _types.none(out, i, v), codegen

        return put

    _put16 = _make_put(2)
    _put32 = _make_put(4)

    @_intrinsic
    def _tails8(typingctx, U, j, idx, m, i):
        """Vectorized compaction step: of p = U[j : j + 8], lane l is a tail if not |p - 0.5| <= 0.425; the
        element numbers i + l of the tail lanes are written, in order, to idx[m:] (8 slots are stored: idx
        needs 8 spare slots at the end); returns m + the number of tails. One compare, one
        ``llvm.experimental.vector.compress`` (vpcompressd on AVX-512, generic code elsewhere), one store.
        """
        if not (isinstance(U, _types.Array) and U.dtype == _types.float64 and U.layout == "C"
                and isinstance(idx, _types.Array) and idx.dtype == _types.int32 and idx.layout == "C"):
            return None
        sig = _types.int64(U, _types.int64, idx, _types.int64, _types.int64)

        def codegen(context, builder, sig, args):
            uty, _, ity, _, _ = sig.args
            u_arr = context.make_array(uty)(context, builder, args[0])
            i_arr = context.make_array(ity)(context, builder, args[2])
            i32 = _ir.IntType(32)
            f64x8 = _ir.VectorType(_ir.DoubleType(), 8)
            i32x8 = _ir.VectorType(i32, 8)
            i1x8 = _ir.VectorType(_ir.IntType(1), 8)
            mod = builder.module
            p = builder.load(builder.bitcast(builder.gep(u_arr.data, [args[1]]), f64x8.as_pointer()), align=8)
            q = builder.fsub(p, _ir.Constant(f64x8, [0.5] * 8))
            fabs = _cgutils.get_or_insert_function(mod, _ir.FunctionType(f64x8, [f64x8]), "llvm.fabs.v8f64")
            # "not |q| <= 0.425" is the unordered-or-greater comparison (true for NaN, as in the reference)
            tail = builder.fcmp_unordered(">", builder.call(fabs, [q]), _ir.Constant(f64x8, [0.425] * 8))
            first = builder.insert_element(_ir.Constant(i32x8, _ir.Undefined), builder.trunc(args[4], i32),
                                           _ir.Constant(i32, 0))
            lanes = builder.shuffle_vector(first, _ir.Constant(i32x8, _ir.Undefined), _ir.Constant(i32x8, [0] * 8))
            lanes = builder.add(lanes, _ir.Constant(i32x8, list(range(8))))
            compress = _cgutils.get_or_insert_function(
                mod, _ir.FunctionType(i32x8, [i32x8, i1x8, i32x8]), "llvm.experimental.vector.compress.v8i32")
            packed = builder.call(compress, [lanes, tail, _ir.Constant(i32x8, _ir.Undefined)])
            builder.store(packed, builder.bitcast(builder.gep(i_arr.data, [args[3]]), i32x8.as_pointer()), align=4)
            ctpop = _cgutils.get_or_insert_function(mod, _ir.FunctionType(_ir.IntType(8), [_ir.IntType(8)]),
                                                   "llvm.ctpop.i8")
            n = builder.zext(builder.call(ctpop, [builder.bitcast(tail, _ir.IntType(8))]), _ir.IntType(64))
            return builder.add(args[3], n)

        return sig, codegen

    # -- constants (frozen into the machine code) ---------------------------------------------------
    _u64 = np.uint64
    _M0, _M1 = _u64(PHILOX_M0), _u64(PHILOX_M1)
    _W0, _W1 = _u64(PHILOX_W0), _u64(PHILOX_W1)
    _MASK32 = _u64(0xFFFFFFFF)
    _SH32 = _u64(32)
    _TWO_M32 = 2.0**-32
    _EXP52 = _u64(0x4330000000000000)  # the bits of 2.0**52
    _TWO52 = 2.0**52
    # AS241_A ... AS241_F (tuples, highest degree first) are read through _horner8, frozen in like these
    _L1, _L2, _L3, _L4, _L5, _L6, _L7, _L8, _L9, _L10 = LOG_C[1:]
    _MANT_MASK = _u64(0x800FFFFFFFFFFFFF)  # sign and mantissa (the sign is 0 here)
    _HALF_EXP = _u64(0x3FE0000000000000)  # biased exponent of [0.5, 1)
    _SH52 = _u64(52)
    _HALF_F32 = np.float32(0.5)

    # -- building blocks ----------------------------------------------------------------------------
    @_helper()
    def _philox_u(U, c_first, ncnt, k0, k1):
        """U[4t + j] = (x + 0.5) * 2**-32, x = word j of Philox4x32-10((c, c >> 32, 0, 0); k), c = c_first + t."""
        for t in range(ncnt):
            c = c_first + _u64(t)
            x0 = c & _MASK32
            x1 = c >> _SH32
            x2 = _u64(0)
            x3 = _u64(0)
            kk0 = k0
            kk1 = k1
            for _ in range(10):
                p0 = _M0 * x0  # exact 32 x 32 -> 64-bit products
                p1 = _M1 * x2
                y0 = ((p1 >> _SH32) ^ x1 ^ kk0) & _MASK32
                y2 = ((p0 >> _SH32) ^ x3 ^ kk1) & _MASK32
                x1 = p1 & _MASK32
                x3 = p0 & _MASK32
                x0 = y0
                x2 = y2
                kk0 = (kk0 + _W0) & _MASK32  # wrapping 32-bit key schedule
                kk1 = (kk1 + _W1) & _MASK32
            # float64(x) for x < 2**32 as (2**52 + x) - 2**52, both exact: an OR and a subtraction
            # vectorize everywhere, where an int64 -> float64 conversion is scalar without AVX-512DQ
            U[4 * t] = ((_bits_f64(_EXP52 | x0) - _TWO52) + 0.5) * _TWO_M32
            U[4 * t + 1] = ((_bits_f64(_EXP52 | x1) - _TWO52) + 0.5) * _TWO_M32
            U[4 * t + 2] = ((_bits_f64(_EXP52 | x2) - _TWO52) + 0.5) * _TWO_M32
            U[4 * t + 3] = ((_bits_f64(_EXP52 | x3) - _TWO52) + 0.5) * _TWO_M32

    # -- normal_ppf (AS241) and log_ieee ----------------------------------------------------------------
    # One of the four deliberate copies of this code, each in the form its compiler needs: special.py
    # (numpy, the reference), scalar.py (plain Python, the line-by-line model), here (numba: central formula
    # for every element, then the listed tails) and cuda.py (Triton: branch-free, coefficients selected per
    # element). The constants come from special.py. Proved equal to the reference by the bytes: the golden
    # vectors (tests/support/golden.py, through this kernel in tests/server/engine/test_kernel_cpu.py::test_golden) and the
    # randomized table of tests/server/engine/test_kernel_cpu.py (test_random_table: both AS241 tail branches, deep
    # reflected tails; test_portable_code_for_a_generic_cpu without AVX).
    @_helper()
    def _horner8(c, r):
        """H(c; r) = (((c7*r + c6)*r + ...)*r + c0) for an AS241 coefficient tuple ``c`` (highest degree
        first), every product and sum rounded separately."""
        return ((((((c[0] * r + c[1]) * r + c[2]) * r + c[3]) * r + c[4]) * r + c[5]) * r + c[6]) * r + c[7]

    @_helper()
    def _central(p):
        """AS241's central formula at p: (q * A(r)) / B(r) with q = p - 0.5, r = 0.180625 - q * q."""
        q = p - 0.5
        r = 0.180625 - q * q
        return (q * _horner8(AS241_A, r)) / _horner8(AS241_B, r)

    @_helper()
    def _log_ieee(x):
        """log_ieee(x) of a positive normal float64 x, the frexp taken from the bits (m in [0.5, 1))."""
        bits = _f64_bits(x)
        m = _bits_f64((bits & _MANT_MASK) | _HALF_EXP)
        e = np.int64(bits >> _SH52) - 1022
        if m < SQRT_HALF:
            m = m * 2.0
            e = e - 1
        f = m - 1.0
        s = f / (2.0 + f)
        s2 = s * s
        Q = _L10 * s2 + _L9
        Q = Q * s2 + _L8
        Q = Q * s2 + _L7
        Q = Q * s2 + _L6
        Q = Q * s2 + _L5
        Q = Q * s2 + _L4
        Q = Q * s2 + _L3
        Q = Q * s2 + _L2
        Q = Q * s2 + _L1
        t = s2 * Q
        logm = (s + s * t) * 2.0
        E = np.float64(np.int32(e))  # |e| < 1100: exact, and int32 -> float64 vectorizes without AVX-512DQ
        return E * LN2_HI + (logm + E * LN2_LO)

    @_helper()
    def _ppf_central(U, n, Z):
        """Z[i] = AS241 central formula at p = U[i], for every i < n (the tails are redone later)."""
        for i in range(n):
            Z[i] = _central(U[i])

    @_helper()
    def _ppf_central_trunc(U, n, Z, plo, pw):
        """trunc_normal: U[i] = u2 = plo + u * pw, lowered to U2_MAX above it; then as _ppf_central."""
        for i in range(n):
            t = U[i] * pw
            p = plo + t
            if p > U2_MAX:
                p = U2_MAX
            U[i] = p
            Z[i] = _central(p)

    @_helper()
    def _list_tails_compress(U, n, idx, P):
        """The i < n with not |p - 0.5| <= 0.425, p = U[i]: idx[:m] = i, P[:m] = p; returns m.

        Vectorized compaction 8 elements at a time (:func:`_tails8`), then branch-free for the last few
        (every element is written at position m, which advances only for a tail); then P is gathered.
        """
        m = 0
        n8 = n - n % 8
        for i in range(0, n8, 8):
            m = _tails8(U, i, idx, m, i)
        for i in range(n8, n):
            idx[m] = i
            m += 0 if abs(U[i] - 0.5) <= 0.425 else 1
        for k in range(m):
            P[k] = U[idx[k]]
        return m

    @_helper()
    def _list_tails_scalar(U, n, idx, P):
        """:func:`_list_tails_compress` without the vector compress: branch-free, one element at a time."""
        m = 0
        for i in range(n):
            idx[m] = i
            m += 0 if abs(U[i] - 0.5) <= 0.425 else 1
        for k in range(m):
            P[k] = U[idx[k]]
        return m

    # The vector compress is one instruction with AVX-512 (vpcompressd) and a long generic sequence
    # elsewhere, where the scalar loop is twice as fast (measured on AVX2). The choice depends on the
    # CPU only, as numba's cache key does; both give the same list.
    _list_tails = _list_tails_compress if _VECTOR_COMPRESS else _list_tails_scalar

    @_helper()
    def _ppf_tails(P, m, R):
        """P[k] = AS241 tail value at p = P[k] (in place) for k < m, by the r <= 5 rational function.

        R[k] = r = sqrt(-log_ieee(min(p, 1 - p))) (> 0), negated where q < 0, for :func:`_far_tails`.
        Returns the number of r > 5 (never for normal: there r <= 4.78).
        """
        nfar = 0
        for k in range(m):
            p = P[k]
            r = np.sqrt(-_log_ieee(p if p < 0.5 else 1.0 - p))  # the argument is a positive normal number
            R[k] = -r if p < 0.5 else r
            nfar += 1 if r > 5.0 else 0
            rn = r - 1.6
            z = _horner8(AS241_C, rn) / _horner8(AS241_D, rn)
            P[k] = -z if p < 0.5 else z
        return nfar

    @_helper()
    def _far_tails(P, m, R):
        """P[k] = the r > 5 rational function where |R[k]| > 5 (p < exp(-25): deep trunc_normal tails only)."""
        for k in range(m):
            rs = R[k]
            r = abs(rs)
            if r > 5.0:
                rf = r - 5.0
                z = _horner8(AS241_E, rf) / _horner8(AS241_F, rf)
                P[k] = -z if rs < 0.0 else z

    @_helper()
    def _scatter(Z, idx, P, m):
        for k in range(m):
            Z[idx[k]] = P[k]

    @_helper()
    def _f32_to_f16(b):
        """float16 bits of the float32 with bits ``b`` (uint64 holding 32 bits): RNE, subnormals kept.

        The same result as numpy's ``float32.astype(float16)`` for every finite float32 (and inf -> inf).
        """
        sign = (b >> _u64(16)) & _u64(0x8000)
        a = b & _u64(0x7FFFFFFF)
        # normal result (|x| >= 2**-14): rebias the exponent by 127 - 15, round off 13 bits to nearest even
        nrm = (a - _u64(0x38000000) + _u64(0xFFF) + ((a >> _u64(13)) & _u64(1))) >> _u64(13)
        # subnormal result (|x| < 2**-14): |x| + 0.5 in float32 rounds |x| to a multiple of 2**-24 (the
        # float16 subnormal step; RNE, exact IEEE float32 addition), the low bits are then the float16 bits
        sub = _f32_bits(_bits_f32(a) + _HALF_F32) - _u64(0x3F000000)
        h = sub if a < _u64(0x38800000) else nrm
        h = h if a < _u64(0x47800000) else _u64(0x7C00)  # |x| >= 65536 or inf (never reached: check_dtype)
        return h | sign

    @_helper()
    def _value_f32(z, mean, std, flip, a, b):
        """The float32 bits of v = mean + std * z after the trunc_normal guards: z = -z if flip; z = a if
        z < a; z = b if z > b (plain comparisons: a tie keeps z). Other kinds pass flip = False, a = -inf,
        b = +inf, which leave every z unchanged. Then t = std * z, v = mean + t, float64 -> float32 (RNE)."""
        if flip:
            z = -z
        if z < a:
            z = a
        if z > b:
            z = b
        t = std * z
        return _f32_bits(np.float32(mean + t))

    @_helper()
    def _store(Z, n, mean, std, flip, a, b, out, o, dt):
        """Element o + i of ``out`` (bytes, little-endian) = the dtype bits of :func:`_value_f32` of Z[i],
        for i < n (one loop per dtype, so that each vectorizes)."""
        if dt == 0:
            for i in range(n):
                _put32(out, o + i, _value_f32(Z[i], mean, std, flip, a, b))
        elif dt == 1:
            for i in range(n):
                bits = _value_f32(Z[i], mean, std, flip, a, b)
                _put16(out, o + i, (bits + _u64(0x7FFF) + ((bits >> _u64(16)) & _u64(1))) >> _u64(16))
        else:
            for i in range(n):
                _put16(out, o + i, _f32_to_f16(_value_f32(Z[i], mean, std, flip, a, b)))

    @_helper()
    def _aligned_f64(n):
        """An uninitialized float64 array of n elements starting on a 64-byte boundary (whole cache lines
        per 512-bit load / store; numba's own alignment for float64 arrays is smaller)."""
        raw = np.empty(n + 8, dtype=np.float64)
        o = ((64 - (raw.ctypes.data & 63)) & 63) >> 3
        return raw[o : o + n]

    @_jit(cache=False)  # not inlined: the same compiled code runs in the serial kernel and in the prange body
    def _blocks(out, b0, b1, count, start, prm):
        """Blocks b0 <= bidx < b1 of the output: ``out`` holds the bytes of elements start, start + 1, ...;
        block bidx is elements start + bidx * BLOCK ... . ``prm``: the shared scalars (see "Kernel
        arguments"). The scratch arrays are allocated once for all."""
        k0, k1, kind, dt, mean, std, a, b, plo, pw, flip = prm
        U = _aligned_f64(BLOCK + 8)
        Z = _aligned_f64(BLOCK)
        P = _aligned_f64(BLOCK)
        R = _aligned_f64(BLOCK)
        idx = np.empty(BLOCK + 8, dtype=np.int32)
        for j in range(b1 - b0):
            s = (b0 + j) * BLOCK
            n = min(BLOCK, count - s)
            gs = start + s  # absolute index of the block's first element
            c_first = gs // 4
            off = gs - 4 * c_first  # U[off] is element gs
            _philox_u(U, _u64(c_first), (off + n + 3) // 4, k0, k1)
            # a view starting at the block's first element (index arithmetic from 0: no offset to carry)
            Ub = U[off : off + n]
            if kind == 2:  # uniform: v = low + d * u (mean = low, std = d = high - low)
                _store(Ub, n, mean, std, False, a, b, out, s, dt)
                continue
            if kind == 1:
                _ppf_central_trunc(Ub, n, Z, plo, pw)
            else:
                _ppf_central(Ub, n, Z)
            m = _list_tails(Ub, n, idx, P)
            if _ppf_tails(P, m, R):
                _far_tails(P, m, R)
            _scatter(Z, idx, P, m)
            _store(Z, n, mean, std, flip, a, b, out, s, dt)

    # -- the kernels (out: the uint8 output buffer, any alignment: one specialization each) -----------
    # Kernel arguments: each kernel's own leading ones (range: out, count, start; runs: out, starts,
    # counts, offs, cum, item), then the shared scalars k0, k1, kind, dt, mean, std, a, b, plo, pw, flip
    # (built once per call on the host by _kernel_args), then nchunks. The entry points take the shared
    # scalars flat, as numba's dispatcher types them (one specialization: their types never change), and
    # pack them into one tuple, prm, which _runs_body passes on and only _blocks unpacks.
    @_jit(parallel=True)
    def _kernel_par(out, count, start, k0, k1, kind, dt, mean, std, a, b, plo, pw, flip, nchunks):
        prm = (k0, k1, kind, dt, mean, std, a, b, plo, pw, flip)
        nb = (count + BLOCK - 1) // BLOCK
        nch = min(nb, nchunks)
        for ch in _numba.prange(nch):
            _blocks(out, ch * nb // nch, (ch + 1) * nb // nch, count, start, prm)

    @_jit()
    def _kernel_ser(out, count, start, k0, k1, kind, dt, mean, std, a, b, plo, pw, flip, nchunks):
        prm = (k0, k1, kind, dt, mean, std, a, b, plo, pw, flip)
        _blocks(out, 0, (count + BLOCK - 1) // BLOCK, count, start, prm)

    # -- runs: many ranges of one tensor, back to back in out (a column block is one run per row) ----
    @_jit(cache=False)
    def _runs_body(out, starts, counts, offs, cum, u0, u1, item, prm):
        """Work units u0 <= u < u1 of a list of non-empty runs: unit u is block u - cum[r] of run r
        (cum[r] <= u < cum[r + 1]); run r's bytes start at out[offs[r] * item]."""
        r = np.searchsorted(cum, u0, side="right") - 1
        u = u0
        while u < u1:
            while cum[r + 1] <= u:
                r += 1
            b0 = u - cum[r]
            b1 = min(u1, cum[r + 1]) - cum[r]
            o = offs[r] * item
            _blocks(out[o : o + counts[r] * item], b0, b1, counts[r], starts[r], prm)
            u += b1 - b0

    @_jit(parallel=True)
    def _kernel_runs_par(out, starts, counts, offs, cum, item, k0, k1, kind, dt, mean, std, a, b, plo, pw, flip,
                         nchunks):
        prm = (k0, k1, kind, dt, mean, std, a, b, plo, pw, flip)
        total = cum[cum.size - 1]
        nch = min(total, nchunks)
        for ch in _numba.prange(nch):
            _runs_body(out, starts, counts, offs, cum, ch * total // nch, (ch + 1) * total // nch, item, prm)

    @_jit()
    def _kernel_runs_ser(out, starts, counts, offs, cum, item, k0, k1, kind, dt, mean, std, a, b, plo, pw, flip,
                         nchunks):
        prm = (k0, k1, kind, dt, mean, std, a, b, plo, pw, flip)
        _runs_body(out, starts, counts, offs, cum, 0, cum[cum.size - 1], item, prm)


# ------------------------------------------------------------------------------------------------
# public API
# ------------------------------------------------------------------------------------------------


def _require() -> None:
    if not available():
        raise RuntimeError("modelinit: the numba CPU kernel is not available (numba is not installed)")


def _launch(kern, *call) -> None:
    try:
        kern(*call)
    except Exception as e:
        # The kernels raise nothing at run time, so this is the first call's compilation failing in
        # numba's on-disk cache (unwritable or full disk, a corrupt index file): go on without it.
        cache = getattr(kern, "_cache", None)
        if not getattr(cache, "_enabled", False):
            raise
        warnings.warn(f"modelinit: numba cache failed ({e!r}); compiling without it", stacklevel=3)
        cache.disable()
        kern(*call)


def _kernel_args(sampler: Sampler, key: tuple[int, int], dtype: str) -> tuple:
    """The kernels' shared scalars, built once per call: ``(k0, k1, kind, dt, mean, std, a, b, plo, pw,
    flip)``, the arguments of every kernel from ``k0`` on but ``nchunks`` (see "Kernel arguments" above).
    The float64 scalars are :func:`.reference.kernel_scalars`, shared with the Triton kernel."""
    ks = kernel_scalars(sampler)
    return (np.uint64(key[0]), np.uint64(key[1]), _KIND_CODE[sampler.kind], _DTYPE_CODE[dtype],
            float(ks.mean), float(ks.std), float(ks.a), float(ks.b), float(ks.plo), float(ks.pw), bool(ks.flip))


def _dispatch(serial, parallel, head: tuple, tail: tuple, count: int, threads: int | None) -> None:
    """Run ``kernel(*head, *tail, nchunks)`` on this thread (small or ``threads=1``) or on numba's pool."""
    if count <= SERIAL_MAX or threads == 1:
        _launch(serial, *head, *tail, CHUNKS_PER_THREAD)
        return
    with _launch_lock:
        before = _numba.get_num_threads()  # per-thread settings in numba
        if threads is not None:
            _numba.set_num_threads(threads)
        chunksize = _numba.set_parallel_chunksize(1)  # dynamic: a busy core gets fewer chunks
        try:
            _launch(parallel, *head, *tail, CHUNKS_PER_THREAD * _numba.get_num_threads())
        finally:
            _numba.set_parallel_chunksize(chunksize)
            _numba.set_num_threads(before)


def _constant(view: np.ndarray, sampler: Sampler, dtype: str) -> None:
    # no random bits: one value, rounded by the reference's own code
    view[:] = to_dtype(np.array([sampler.value], dtype=np.float64), dtype).view(view.dtype)[0]


def _run(out: np.ndarray, sampler: Sampler, key: tuple[int, int], start: int, count: int, dtype: str,
         threads: int | None) -> None:
    """Fill the uint8 array ``out`` (count * itemsize bytes, any alignment)."""
    view = out.view(_OUT_VIEW[dtype])  # for numpy's fills only (it may be unaligned; numpy copes)
    if count:
        if sampler.kind == "constant":
            _constant(view, sampler, dtype)
        else:
            _dispatch(_kernel_ser, _kernel_par, (out, count, start), _kernel_args(sampler, key, dtype), count, threads)
    i0, i1 = zero_range(sampler, start, count)
    if i0 < i1:
        view[i0 - start : i1 - start] = 0  # +0.0 in every dtype


def _check_threads(threads: int | None) -> None:
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= _numba.config.NUMBA_NUM_THREADS
    ):
        raise ValueError(f"threads: must be None or an integer in [1, {_numba.config.NUMBA_NUM_THREADS}], got {threads!r}")


def generate_into(out: np.ndarray, sampler: Sampler, key: tuple[int, int], start: int, count: int, dtype: str,
                  *, threads: int | None = None) -> None:
    """Write the little-endian bytes of elements ``[start, start + count)`` into ``out``.

    ``out`` is a writable, C-contiguous 1-D ``uint8`` array of exactly ``count * DTYPE_ITEMSIZE[dtype]``
    bytes (for example a view into a larger chunk buffer, at any byte offset). The bytes are exactly
    those of :func:`.reference.generate`. The arguments are validated as it does (same ``ValueError``
    messages), then ``out`` (``ValueError`` naming ``out``).

    ``threads``: numba threads for this call (``None``: the calling thread's numba setting, by default
    all cores, ``NUMBA_NUM_THREADS``). Calls of up to :data:`SERIAL_MAX` elements run on the calling
    thread only. The GIL is released while the kernel runs.
    """
    _require()
    key, start, count = check_args(sampler, key, start, count, dtype)
    _check_threads(threads)
    if not isinstance(out, np.ndarray) or out.dtype != np.uint8 or out.ndim != 1:
        raise ValueError(f"out: must be a 1-D uint8 numpy array, got {getattr(out, 'dtype', type(out).__name__)}")
    nbytes = count * DTYPE_ITEMSIZE[dtype]
    if out.nbytes != nbytes:
        raise ValueError(f"out: must hold exactly count * itemsize = {nbytes} bytes, got {out.nbytes}")
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("out: must be C-contiguous and writable")
    _run(out, sampler, key, start, count, dtype, threads)


def generate_runs_into(out: np.ndarray, sampler: Sampler, key: tuple[int, int], starts, counts, dtype: str,
                       *, threads: int | None = None) -> None:
    """Write the bytes of elements ``[starts[r], starts[r] + counts[r])`` for every run ``r``, back to
    back in run order, into ``out`` (a C-contiguous 1-D ``uint8`` array of exactly ``sum(counts) *
    itemsize`` bytes): the bytes of :func:`generate_into` called once per run, in one launch whose
    threads share all the runs' blocks (a column block of a matrix is one short run per row).
    ``starts``/``counts``: 1-D integer arrays of one length (ValueError naming them)."""
    _require()
    key, _, _ = check_args(sampler, key, 0, 0, dtype)
    starts, counts = check_runs(starts, counts)
    _check_threads(threads)
    item = DTYPE_ITEMSIZE[dtype]
    total = int(counts.sum())
    if not isinstance(out, np.ndarray) or out.dtype != np.uint8 or out.ndim != 1:
        raise ValueError(f"out: must be a 1-D uint8 numpy array, got {getattr(out, 'dtype', type(out).__name__)}")
    if out.nbytes != total * item:
        raise ValueError(f"out: must hold exactly sum(counts) * itemsize = {total * item} bytes, got {out.nbytes}")
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("out: must be C-contiguous and writable")
    if total == 0:
        return
    offs = run_offsets(counts)
    view = out.view(_OUT_VIEW[dtype])
    if sampler.kind == "constant":
        _constant(view, sampler, dtype)
    else:
        keep = counts > 0
        s, c, o = starts[keep], counts[keep], offs[keep]
        cum = np.zeros(c.size + 1, dtype=np.int64)
        np.cumsum((c + BLOCK - 1) // BLOCK, out=cum[1:])
        _dispatch(_kernel_runs_ser, _kernel_runs_par, (out, s, c, o, cum, item), _kernel_args(sampler, key, dtype),
                  total, threads)
    if sampler.zero_row is not None:
        lo = sampler.zero_row * sampler.row_size
        i0 = np.maximum(starts, lo)
        i1 = np.minimum(starts + counts, lo + sampler.row_size)
        for r in np.nonzero(i0 < i1)[0]:
            view[offs[r] + i0[r] - starts[r] : offs[r] + i1[r] - starts[r]] = 0  # +0.0 in every dtype


def generate(sampler: Sampler, key: tuple[int, int], start: int, count: int, dtype: str,
             *, threads: int | None = None) -> bytes:
    """The bytes of :func:`.reference.generate` (same arguments, same ``ValueError``s), computed by the kernel."""
    _require()
    key, start, count = check_args(sampler, key, start, count, dtype)
    _check_threads(threads)
    out = np.empty(count * DTYPE_ITEMSIZE[dtype], dtype=np.uint8)
    _run(out, sampler, key, start, count, dtype, threads)
    return out.tobytes()


def threads() -> int:
    """The numba threads a call with ``threads=None`` uses on this thread (all cores by default)."""
    _require()
    return _numba.get_num_threads()


def _first_calls() -> tuple[tuple, tuple, tuple, tuple]:
    """The arguments of one call of each kernel (serial, serial runs, parallel, parallel runs), of the
    types every later call has: one machine-code specialization each."""
    out = np.empty(32, dtype=np.uint8)
    tail = _kernel_args(Sampler("normal"), (0, 0), "float32")
    one = np.zeros(1, dtype=np.int64)
    runs = (out, one, one + 8, one, np.array([0, 1], dtype=np.int64), 4)
    return (out, 8, 0, *tail, 1), (*runs, *tail, 1), (out, 8, 0, *tail, 1), (*runs, *tail, 1)


def warmup() -> None:
    """Compile, or load from numba's on-disk cache, every kernel, so that no request waits for it.

    There are four machine-code specializations, the parallel and the serial kernel of one range and of
    a list of runs: kind and dtype are run-time arguments, and the output is always the uint8 buffer
    (any alignment). About 10 s of compilation on 2 cores the first time (the GIL is held meanwhile),
    under a second from the cache.
    """
    _require()
    ser, runs_ser, par, runs_par = _first_calls()
    _launch(_kernel_ser, *ser)
    _launch(_kernel_runs_ser, *runs_ser)
    with _launch_lock:
        _launch(_kernel_par, *par)
        _launch(_kernel_runs_par, *runs_par)


def load_serial() -> None:
    """Compile, or load from numba's on-disk cache, the serial kernels without running one: for a
    process that forks workers, which inherit the machine code instead of each loading it (about half
    a second apiece). Not the parallel ones: compiling those starts numba's threading layer, and a
    child forked after GNU OpenMP has started aborts when it uses it ("fork() called from a process
    already using GNU OpenMP")."""
    _require()
    ser, runs_ser, _, _ = _first_calls()
    for kern, call in ((_kernel_ser, ser), (_kernel_runs_ser, runs_ser)):
        kern.compile(tuple(_numba.typeof(a) for a in call))
