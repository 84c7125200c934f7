"""The numba CPU kernel (engine/cpu.py) is bit-identical to the numpy reference engine.

Every comparison is of bytes: golden vectors, a broad seeded random table (every kind, deep and
reflected trunc_normal tails, every dtype incl. float16 subnormals, unaligned and huge starts, block and
serial/parallel boundaries, padding rows), >= 1e7 elements per dtype for normal and trunc_normal, and
the float32 -> float16 rounding against numpy on all tie patterns. Also: argument validation matches
the reference, no FMA instruction in the compiled kernels, and the numba cache falls back gracefully.
"""
from __future__ import annotations

import hashlib
import math
import os
import pathlib
import random
import re
import subprocess
import sys
import threading

import numpy as np
import pytest

numba = pytest.importorskip("numba")

from modelinit_server.engine import (  # noqa: E402
    DTYPE_ITEMSIZE,
    DTYPES,
    Sampler,
    canonical_name,
    reference,
    cpu,
    tensor_key,
)

from tests.support import kernels  # noqa: E402
from tests.support.golden import GOLDEN, GOLDEN_V2  # noqa: E402

SERVER_DIR = str(pathlib.Path(cpu.__file__).resolve().parents[2])


@pytest.fixture(scope="module", autouse=True)
def _compiled():
    assert cpu.available()
    cpu.warmup()  # compile (or load from the cache) once for the whole module


def ref(sampler, key, start, count, dtype) -> bytes:
    return reference.generate(sampler, key, start, count, dtype)


def assert_same(got: bytes, want: bytes, dtype: str, what) -> None:
    if got == want:
        return
    w = np.dtype("<u4") if dtype == "float32" else np.dtype("<u2")
    g, r = np.frombuffer(got, w), np.frombuffer(want, w)
    assert g.size == r.size, (what, g.size, r.size)
    bad = np.flatnonzero(g != r)
    pytest.fail(f"{what}: {bad.size} elements differ, first at {bad[:5].tolist()}: "
                f"kernel {[hex(v) for v in g[bad[:5]]]} reference {[hex(v) for v in r[bad[:5]]]}")


def kernel_into(sampler, key, start, count, dtype, *, threads=None, pad=3) -> bytes:
    """generate_into on a view at an odd byte offset of a larger buffer (the neighbours must stay intact)."""
    n = count * DTYPE_ITEMSIZE[dtype]
    buf = np.full(n + 2 * pad, 0xA5, dtype=np.uint8)
    cpu.generate_into(buf[pad : pad + n], sampler, key, start, count, dtype, threads=threads)
    assert (buf[:pad] == 0xA5).all() and (buf[pad + n :] == 0xA5).all()
    return buf[pad : pad + n].tobytes()


def runs_into(sampler, key, starts, counts, dtype, *, threads=None, pad=3) -> bytes:
    """generate_runs_into on a view at an odd byte offset of a larger buffer (neighbours intact)."""
    n = int(sum(counts)) * DTYPE_ITEMSIZE[dtype]
    buf = np.full(n + 2 * pad, 0xA5, dtype=np.uint8)
    cpu.generate_runs_into(buf[pad : pad + n], sampler, key, np.asarray(starts, np.int64), np.asarray(counts, np.int64),
                           dtype, threads=threads)
    assert (buf[:pad] == 0xA5).all() and (buf[pad + n :] == 0xA5).all()
    return buf[pad : pad + n].tobytes()


# ------------------------------------------------------------------------------------------------
# golden vectors
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", GOLDEN, ids=[c[0] for c in GOLDEN])
def test_golden(case):
    _, seed, name, kwargs, dtype, start, count, digest = case
    s, key = Sampler(**kwargs), tensor_key(seed, name)
    assert hashlib.sha256(cpu.generate(s, key, start, count, dtype)).hexdigest() == digest
    for threads in (1, 2):
        assert hashlib.sha256(kernel_into(s, key, start, count, dtype, threads=threads)).hexdigest() == digest


@pytest.mark.parametrize("case", GOLDEN_V2, ids=[c[0] for c in GOLDEN_V2])
def test_golden_v2(case):
    """Version 2 differs only in the key: the kernel, given the v2 key, makes the pinned bytes."""
    _, seed, name, prefix, kwargs, dtype, start, count, digest = case
    s, key = Sampler(**kwargs), tensor_key(seed, canonical_name(name, prefix), 2)
    assert hashlib.sha256(cpu.generate(s, key, start, count, dtype)).hexdigest() == digest


def test_golden_cases_also_through_the_parallel_kernel():
    """The golden cases are small (serial kernel): the same tensors, made larger, through the parallel one."""
    for _, seed, name, kwargs, dtype, start, count, _ in GOLDEN:
        s, key = Sampler(**kwargs), tensor_key(seed, name)
        n = cpu.SERIAL_MAX + count + 1
        assert_same(kernel_into(s, key, start, n, dtype, threads=2), ref(s, key, start, n, dtype), dtype, name)


# ------------------------------------------------------------------------------------------------
# randomized differential table
# ------------------------------------------------------------------------------------------------

#: trunc_normal (a, b) in sigma units: symmetric, asymmetric, one-sided, infinite, narrow, reflected
#: upper tails (a + b > 0), lower tails, both AS241 tail branches (r > 5 needs u2 < exp(-25): b <= -5.5
#: mixes r <= 5 and r > 5 in one block, b = -7 / a = 7 are r > 5 only), ties of the flip test.
TRUNC_BOUNDS = [
    (-2.0, 2.0), (-1.0, 1.0), (-3.0, 3.0), (-0.5, 3.0), (-3.0, 0.5), (0.0, math.inf), (-math.inf, 0.0),
    (-math.inf, math.inf), (-math.inf, 1.5), (-1.5, math.inf), (0.1, 0.2), (-0.2, -0.1), (1.0, 1.0000001),
    (2.5, 4.0), (-4.0, -2.5), (5.0, math.inf), (-math.inf, -5.0), (-math.inf, -6.0), (6.0, math.inf),
    (-math.inf, -5.5), (5.5, math.inf), (-math.inf, -7.0), (7.0, math.inf), (-7.0, -6.9), (6.9, 7.0),
    (-1e-3, 1e-3), (-2.0, 2.0000000000000004), (-0.3, 0.3), (0.4, 0.45), (-6.5, 6.5), (-38.0, 38.0),
]


def random_sampler(rng: random.Random) -> Sampler:
    kind = rng.choice(["normal", "normal", "trunc_normal", "trunc_normal", "trunc_normal", "uniform", "constant"])
    extra = {}
    if rng.random() < 0.25:
        extra = dict(zero_row=rng.randrange(0, 40), row_size=rng.choice([1, 3, 64, 1000, 4096, 5000]))
    std = rng.choice([1.0, 0.02, 1.5, 1e-3, 3e-5, 1e-6, 1e-7, 1e-9, 7.0, 100.0])
    mean = rng.choice([0.0, 0.0, 0.1, -1.0, 1e-4, -0.5, 3.0])
    if kind == "normal":
        return Sampler("normal", mean=mean, std=std, **extra)
    if kind == "trunc_normal":
        a, b = rng.choice(TRUNC_BOUNDS)
        return Sampler("trunc_normal", mean=mean, std=std, a=a, b=b, **extra)
    if kind == "uniform":
        lo = rng.choice([-0.05, -1.0, 0.0, -1e-6, 1e-5, -3.0, 0.25])
        return Sampler("uniform", low=lo, high=lo + rng.choice([0.1, 2.0, 1e-5, 2e-6, 7.5]), **extra)
    return Sampler("constant", value=rng.choice([0.0, 1.0, 1.0 / 3.0, -2.5, 1e-6, 3e-8, 65504.0]), **extra)


def random_range(rng: random.Random) -> tuple[int, int]:
    count = rng.choice([
        0, 1, 2, 3, 4, 5, 7, 8, 31, 100, rng.randrange(1, 5000), rng.randrange(1, 100_000),
        cpu.BLOCK - 1, cpu.BLOCK, cpu.BLOCK + 1, 3 * cpu.BLOCK + 2,
        cpu.SERIAL_MAX - 1, cpu.SERIAL_MAX, cpu.SERIAL_MAX + 1, cpu.SERIAL_MAX + 5, rng.randrange(20_000, 100_001),
    ])
    start = rng.choice([
        0, 0, rng.randrange(1, 8), rng.randrange(0, 10**6), rng.randrange(0, 2**40),
        4 * 2**32 - rng.randrange(0, 3 * count + 9),  # counter word 1 changes inside the range
        2**62 - count - rng.randrange(0, 5),  # the largest allowed indices
        rng.randrange(0, 2**62 - count + 1),
    ])
    return max(0, min(start, 2**62 - count)), count


def test_random_table():
    rng = random.Random(20240601)
    checked = 0
    for case in range(1200):
        s = random_sampler(rng)
        start, count = random_range(rng)
        dtype = rng.choice(DTYPES)
        key = (rng.getrandbits(32), rng.getrandbits(32))
        if rng.random() < 0.1:
            key = rng.choice([(0, 0), (0xFFFFFFFF, 0xFFFFFFFF)])
        try:
            want = ref(s, key, start, count, dtype)
        except ValueError as e:  # the sampler's support overflows the dtype: the kernel refuses it too
            with pytest.raises(ValueError) as got:
                cpu.generate(s, key, start, count, dtype)
            assert str(got.value) == str(e)
            continue
        threads = rng.choice([None, 1, 2])
        what = (case, s, key, start, count, dtype, threads)
        assert_same(kernel_into(s, key, start, count, dtype, threads=threads), want, dtype, what)
        checked += 1
    assert checked > 1000


@pytest.mark.parametrize("dtype", DTYPES)
def test_float16_subnormals_and_tiny_values(dtype):
    """Values around the float16 subnormal range, float32 subnormals (which a flush-to-zero mode in any
    worker thread would destroy) and zero, all kinds, through the parallel kernel (> SERIAL_MAX)."""
    key = tensor_key(3, "tiny")
    for std in (6e-5, 1e-5, 3e-7, 6e-8, 2.9802322387695312e-08, 1e-8, 1e-30, 1e-39, 3e-42, 1e-45):
        for s in (Sampler("normal", std=std), Sampler("trunc_normal", std=std, a=-1.0, b=3.0),
                  Sampler("uniform", low=-std, high=std), Sampler("normal", mean=std, std=std / 3)):
            assert_same(cpu.generate(s, key, 5, 30_001, dtype), ref(s, key, 5, 30_001, dtype), dtype, (s, dtype))


def test_slices_concatenate_to_the_whole():
    s, key = Sampler("trunc_normal", std=0.5, a=-1.0, b=2.5), tensor_key(9, "slices")
    whole = cpu.generate(s, key, 11, 70_000, "bfloat16")
    cuts = [0, 1, 5, 4096, 4099, 20_000, 20_003, 69_999, 70_000]
    parts = b"".join(cpu.generate(s, key, 11 + a, b - a, "bfloat16") for a, b in zip(cuts, cuts[1:]))
    assert parts == whole == ref(s, key, 11, 70_000, "bfloat16")


RUN_SAMPLERS = [
    Sampler("normal", std=0.02),
    Sampler("trunc_normal", std=0.5, a=-1.0, b=2.5),
    Sampler("trunc_normal", mean=0.0, std=1.0, a=4.0, b=9.0),  # deep, reflected tail
    Sampler("uniform", low=-0.3, high=0.7),
    Sampler("normal", std=1.0, zero_row=3, row_size=1000),  # a padding row across runs
    Sampler("constant", value=1.5),
]


@pytest.mark.parametrize("sampler", RUN_SAMPLERS, ids=lambda s: s.kind)
@pytest.mark.parametrize("dtype", DTYPES)
def test_runs_equal_one_call_per_run(sampler, dtype):
    """A list of runs in one launch (serial and parallel) is the runs' bytes back to back: empty runs,
    runs of one element, runs crossing block boundaries, overlapping and unsorted runs, huge starts."""
    rng = np.random.default_rng(7)
    key = tensor_key(3, "runs")
    cases = [
        ([0], [0]),
        ([5, 5, 9], [1, 0, 1]),
        (list(range(0, 40 * 2816, 2816)), [1408] * 40),  # a column block: one short run per row
        (rng.integers(0, 10**6, 60).tolist(), rng.integers(0, 9000, 60).tolist()),
        ([2**62 - 5000, 3, 2500], [5000, cpu.BLOCK + 1, 700]),
        ([2900, 2000], [1000, 2000]),  # overlapping, out of order
    ]
    for starts, counts in cases:
        want = b"".join(ref(sampler, key, s, c, dtype) for s, c in zip(starts, counts))
        for threads in (1, None):
            assert_same(runs_into(sampler, key, starts, counts, dtype, threads=threads), want, dtype, (starts[:3], threads))


def test_runs_check_their_arguments():
    s, key = GOOD[0], GOOD[1]
    out = np.empty(20, np.uint8)
    for starts, counts, field in [([0, 1], [5], "counts"), ([-1], [10], "starts"), ([0], [-10], "counts"),
                                  ([0.5], [10], "starts"), ([[0]], [10], "starts"), ([2**62], [10], "counts"),
                                  (["a"], [10], "starts")]:
        with pytest.raises(ValueError, match=f"^{field}: "):
            cpu.generate_runs_into(out, s, key, starts, counts, "bfloat16")
    with pytest.raises(ValueError, match="^out: "):
        cpu.generate_runs_into(out, s, key, [0, 100], [5, 6], "bfloat16")
    with pytest.raises(ValueError, match="^sampler: "):
        cpu.generate_runs_into(out, "normal", key, [0], [10], "bfloat16")
    cpu.generate_runs_into(np.empty(0, np.uint8), s, key, [], [], "bfloat16")


def test_both_tail_listings_agree():
    """The vector-compress listing (taken with AVX-512) and the scalar one (taken elsewhere) give the
    same tail list on any host (the compress has generic code where the instruction is missing)."""
    B = cpu.BLOCK
    rng = np.random.default_rng(11)

    @numba.njit(**cpu.JIT_OPTIONS)
    def both(U, n):
        i1, i2 = np.empty(B + 8, np.int32), np.empty(B + 8, np.int32)
        p1, p2 = np.empty(B), np.empty(B)
        m1 = cpu._list_tails_compress(U, n, i1, p1)
        m2 = cpu._list_tails_scalar(U, n, i2, p2)
        return m1, m2, i1[:m1].copy(), i2[:m2].copy(), p1[:m1].copy(), p2[:m2].copy()

    for n in (B, B - 3, 5, 0):
        U = rng.random(B + 8)
        U[:40:3] = [0.075, 0.925, np.nextafter(0.075, 1), np.nextafter(0.925, 0), 0.5, np.nan, 1e-300, 1 - 1e-16,
                    0.0749999, 0.9250001, 0.3, 0.7, 0.075 + 1e-17, 0.925 - 1e-17][: len(U[:40:3])]
        m1, m2, i1, i2, p1, p2 = both(U, n)
        assert m1 == m2 and np.array_equal(i1, i2) and np.array_equal(p1.view(np.uint64), p2.view(np.uint64))
    assert cpu._list_tails is (cpu._list_tails_compress if cpu._VECTOR_COMPRESS else cpu._list_tails_scalar)


def test_one_specialization_per_kernel():
    """Every dtype, alignment, kind and range runs the same machine code: warmup() compiles everything a
    server will ever need (a new specialization at request time would stall it for seconds)."""
    s, key = Sampler("normal"), (1, 2)
    for dtype in DTYPES:
        for pad in (0, 1, 2, 3):
            kernel_into(s, key, 1, 5, dtype, pad=pad)
            kernel_into(s, key, 1, cpu.SERIAL_MAX + 5, dtype, pad=pad)
        runs_into(s, key, [1, 9], [5, cpu.SERIAL_MAX + 5], dtype, pad=pad)
    for k in (cpu._kernel_ser, cpu._kernel_par, cpu._kernel_runs_ser, cpu._kernel_runs_par):
        assert len(k.signatures) == 1, k


@pytest.mark.slow
def test_load_serial_gives_the_specializations_every_call_runs_without_starting_threads():
    """``load_serial`` (what a process that forks workers calls: tests/support/rank_preload.py) compiles,
    or loads, the very machine code later calls run (a child's warmup adds no signature) and starts no
    thread: a child forked after it runs every kernel, the parallel ones too, instead of aborting as a
    child of a process whose GNU OpenMP pool started does."""
    code = """
import os, sys, threading
from modelinit_server.engine import cpu
serial = (cpu._kernel_ser, cpu._kernel_runs_ser)
cpu.load_serial()
assert [len(k.signatures) for k in serial] == [1, 1] and threading.active_count() == 1
pid = os.fork()
if pid == 0:
    cpu.warmup()
    os._exit(0 if [len(k.signatures) for k in serial] == [1, 1] else 3)
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_thread_counts_give_identical_bytes():
    s, key = Sampler("normal", std=0.02), tensor_key(1, "threads")
    n = 300_001
    outs = {kernel_into(s, key, 7, n, "float32", threads=t) for t in (1, 2)}
    assert outs == {ref(s, key, 7, n, "float32")}


def test_concurrent_calls():
    s, key = Sampler("trunc_normal", std=0.02, a=-2.0, b=2.0), tensor_key(2, "concurrent")
    n = 200_000
    want = ref(s, key, 3, n, "bfloat16")
    results, errors = [], []

    def work():
        try:
            for _ in range(3):
                results.append(cpu.generate(s, key, 3, n, "bfloat16"))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 9 and set(results) == {want}


# ------------------------------------------------------------------------------------------------
# >= 1e7 elements per dtype, normal and trunc_normal, compared chunk by chunk
# ------------------------------------------------------------------------------------------------

BIG = 10_000_003
BIG_CHUNK = 1 << 21


@pytest.mark.parametrize("kind", ["normal", "trunc_normal"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_ten_million(kind, dtype):
    if kind == "normal":
        s = {"float32": Sampler("normal", mean=0.1, std=1.5), "bfloat16": Sampler("normal", std=0.02),
             "float16": Sampler("normal", std=1e-4)}[dtype]  # float16: many subnormal results
    else:
        s = {"float32": Sampler("trunc_normal", std=1.0, a=-3.0, b=2.0),
             "bfloat16": Sampler("trunc_normal", std=0.02, a=-2.0, b=2.0),
             "float16": Sampler("trunc_normal", mean=1e-3, std=2e-4, a=-1.0, b=4.0)}[dtype]
    key = tensor_key(77, f"big.{kind}.{dtype}")
    start = 2**33 + 3
    item = DTYPE_ITEMSIZE[dtype]
    out = np.empty(BIG * item, dtype=np.uint8)
    cpu.generate_into(out, s, key, start, BIG, dtype)
    for off in range(0, BIG, BIG_CHUNK):
        n = min(BIG_CHUNK, BIG - off)
        got = out[off * item : (off + n) * item].tobytes()
        assert_same(got, ref(s, key, start + off, n, dtype), dtype, (kind, dtype, off))


# ------------------------------------------------------------------------------------------------
# float32 -> float16 rounding (the kernel's integer / float32 formula) against numpy
# ------------------------------------------------------------------------------------------------


def test_float32_to_float16_rounding_matches_numpy():
    """(Checked once against numpy for all 2**32 float32 bit patterns but NaN: no difference.)"""
    conv = numba.njit(**cpu.JIT_OPTIONS)(_conv_py)
    rng = np.random.default_rng(5)
    parts = [rng.integers(0, 2**32, size=1 << 22, dtype=np.uint64).astype(np.uint32)]
    # every sign / exponent / upper-10-mantissa-bit combination with the low 13 bits at, around and
    # between the ties of a normal float16 result
    hi = np.arange(1 << 19, dtype=np.uint32) << np.uint32(13)
    for low in (0, 1, 0x7FF, 0xFFF, 0x1000, 0x1001, 0x1FFF):
        parts.append(hi | np.uint32(low))
    # float16 subnormal results (2**-25 <= |x| < 2**-14, exponent field 102..112): the float32 mantissa is
    # shifted right by sh = 126 - exponent, so the ties sit at bit sh - 1; every upper part with the low
    # sh bits at, around and between the ties, plus exponents 100, 101, 113 (always 0 / normal results)
    for ex in range(100, 114):
        L = min(126 - ex, 23)
        highs = np.arange(1 << (23 - L), dtype=np.uint32) << np.uint32(L)
        for low in {0, 1, (1 << (L - 1)) - 1, 1 << (L - 1), (1 << (L - 1)) + 1, (1 << L) - 1}:
            parts.append((np.uint32(ex << 23) | highs | np.uint32(low)) | np.uint32(0x8000_0000 * (ex % 2)))
    parts.append(rng.integers(0x3300_0000, 0x3880_0000, size=1 << 22, dtype=np.uint64).astype(np.uint32))
    parts.append(np.arange(0, 1 << 16, dtype=np.uint32))  # float32 zero and subnormals -> 0
    x = np.concatenate(parts)
    f = x.view(np.float32)
    keep = ~np.isnan(f)
    x, f = x[keep], f[keep]
    out = np.empty(x.size, dtype=np.uint16)
    conv(x, out)
    with np.errstate(over="ignore"):
        want = f.astype(np.float16).view(np.uint16)
    bad = np.flatnonzero(out != want)
    assert bad.size == 0, [(hex(int(x[i])), hex(int(out[i])), hex(int(want[i]))) for i in bad[:5]]


def _conv_py(x, out):
    for i in range(x.size):
        out[i] = cpu._f32_to_f16(np.uint64(x[i]))


# ------------------------------------------------------------------------------------------------
# validation: the reference's checks and messages
# ------------------------------------------------------------------------------------------------

GOOD = (Sampler("normal", std=0.02), tensor_key(0, "w"), 0, 10, "bfloat16")


@pytest.mark.parametrize("pos, bad", [
    (0, "normal"), (1, (1, 2, 3)), (1, (-1, 0)), (1, (0, 2**32)), (1, None), (2, -1), (2, True), (2, 1.5),
    (3, -2), (3, False), (3, "10"), (2, 2**62), (4, "float64"), (4, "bf16"), (4, None),
])
def test_validation_matches_reference(pos, bad):
    args = list(GOOD)
    args[pos] = bad
    with pytest.raises(ValueError) as want:
        reference.generate(*args)
    with pytest.raises(ValueError) as got:
        cpu.generate(*args)
    assert str(got.value) == str(want.value)
    buf = np.empty(20, dtype=np.uint8)
    with pytest.raises(ValueError) as got_into:
        cpu.generate_into(buf, *args)
    assert str(got_into.value) == str(want.value)


@pytest.mark.parametrize("s, dtype", [
    (Sampler("normal", std=11000.0), "float16"), (Sampler("uniform", low=-1e39, high=1e39), "float32"),
    (Sampler("constant", value=70000.0), "float16"), (Sampler("trunc_normal", mean=3e38, std=1e37, a=-1.0), "bfloat16"),
])
def test_overflow_refused_like_reference(s, dtype):
    with pytest.raises(ValueError) as want:
        reference.generate(s, (1, 2), 0, 5, dtype)
    with pytest.raises(ValueError) as got:
        cpu.generate(s, (1, 2), 0, 5, dtype)
    assert str(got.value) == str(want.value)


def test_generate_into_checks_out():
    s, key = GOOD[0], GOOD[1]
    for bad in (np.empty(19, np.uint8), np.empty(21, np.uint8), np.empty(10, np.uint16), np.empty((2, 10), np.uint8),
                np.empty(40, np.uint8)[::2], bytearray(20), np.empty(20, np.int8)):
        with pytest.raises(ValueError, match="^out: "):
            cpu.generate_into(bad, s, key, 0, 10, "bfloat16")
    ro = np.zeros(20, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="^out: "):
        cpu.generate_into(ro, s, key, 0, 10, "bfloat16")
    cpu.generate_into(np.empty(0, np.uint8), s, key, 2**62, 0, "float32")  # empty at the very end: fine
    for bad in (0, -1, True, 1.0, 10**6):
        with pytest.raises(ValueError, match="^threads: "):
            cpu.generate(s, key, 0, 10, "bfloat16", threads=bad)


# ------------------------------------------------------------------------------------------------
# machine code: no FMA (contraction would change bytes), and it is vectorized
# ------------------------------------------------------------------------------------------------

FMA = re.compile(r"^\s*v?f(?:n)?m(?:add|sub)\w*", re.M | re.I)  # vfmadd231pd, vfnmsub..., fmadd (aarch64)


def _asm_of(kernel, parallel: bool) -> str:
    """Assembly of an uncached copy of ``kernel`` compiled with the module's options (cached code has none)."""
    d = numba.njit(parallel=parallel, **cpu.JIT_OPTIONS)(kernel.py_func)
    if "runs" in kernel.py_func.__name__:
        one = np.zeros(1, np.int64)
        head = (np.empty(16, np.uint8), one, one + 8, one, np.array([0, 1], np.int64), 2)
    else:
        head = (np.empty(16, np.uint8), 8, 0)
    d(*head, np.uint64(0), np.uint64(0), 1, 2, 0.0, 1.0, -1.0, 1.0, 0.1, 0.8, True, 1)
    (asm,) = d.inspect_asm().values()
    return asm


def test_fma_detector_detects_contraction():
    from llvmlite import binding as llvm

    if not llvm.get_host_cpu_features().get("fma", False):
        pytest.skip("this CPU has no FMA instructions")
    f = numba.njit(fastmath=True)(lambda x, y, z: x * y + z)
    f(1.0, 2.0, 3.0)
    assert FMA.search("\n".join(f.inspect_asm().values())), "the pattern misses a fastmath multiply-add"


@pytest.mark.slow
@pytest.mark.parametrize("name, parallel", [("_kernel_ser", False), ("_kernel_par", True),
                                            ("_kernel_runs_ser", False), ("_kernel_runs_par", True)])
def test_no_fma_in_kernels(name, parallel):
    asm = kernels.compiled_asm(name) or _asm_of(getattr(cpu, name), parallel)  # the run's warm-up's, where it compiled
    assert "div" in asm and "sqrt" in asm, "not the kernel's code"
    found = FMA.findall(asm)
    assert not found, f"FMA instructions in the compiled kernel: {sorted(set(found))}"
    if re.search(r"%[yz]mm", asm):  # x86 with AVX: the AS241 divisions must have been vectorized
        assert re.search(r"\bvdivpd\b", asm), "AS241 divisions not vectorized"


# ------------------------------------------------------------------------------------------------
# numba on-disk cache: NUMBA_CACHE_DIR honoured, no writable location -> in-memory compile
# ------------------------------------------------------------------------------------------------


def _run_py(code: str, env: dict) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": SERVER_DIR, **env})
    assert r.returncode == 0, r.stderr
    return r.stdout + r.stderr


@pytest.mark.slow
def test_numba_cache_dir_is_used(tmp_path):
    code = (
        "import numpy as np\n"
        "from modelinit_server.engine import cpu\n"
        "k = cpu._kernel_ser\n"
        "k(np.empty(32, np.uint8), 8, 0, np.uint64(0), np.uint64(0), 2, 0, 0.0, 1.0, -1.0, 1.0, 0.0, 1.0, False, 1)\n"
        "print('hits', sum(k.stats.cache_hits.values()), 'path', k._cache.cache_path)\n"
    )
    out1 = _run_py(code, {"NUMBA_CACHE_DIR": str(tmp_path)})
    assert f"path {tmp_path}" in out1 and "hits 0" in out1
    assert any(p.suffix == ".nbc" for p in tmp_path.rglob("*")), "nothing written to NUMBA_CACHE_DIR"
    out2 = _run_py(code, {"NUMBA_CACHE_DIR": str(tmp_path)})
    assert "hits 1" in out2, out2


def test_no_writable_cache_location_falls_back_to_memory():
    code = (
        "import warnings, numba.core.caching as c\n"
        "def refuse(self): raise PermissionError('read-only')\n"
        "c._CacheLocator.ensure_cache_path = refuse\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    from modelinit_server.engine import cpu\n"
        "print(type(cpu._kernel_par._cache).__name__, type(cpu._kernel_ser._cache).__name__)\n"
        "print(any('no writable numba cache location' in str(x.message) for x in w))\n"
    )
    out = _run_py(code, {"NUMBA_CACHE_DIR": ""})
    assert "NullCache NullCache" in out and "True" in out, out


def test_engine_imports_without_numba():
    code = (
        "import sys; sys.modules['numba'] = None\n"  # import numba -> ImportError
        "import modelinit_server.engine as e\n"
        "from modelinit_server.engine import cpu\n"
        "assert not cpu.available()\n"
        "try:\n"
        "    cpu.generate(e.Sampler('normal'), (0, 0), 0, 4, 'float32')\n"
        "except RuntimeError as x:\n"
        "    print('refused', x)\n"
    )
    assert "refused" in _run_py(code, {})


@pytest.mark.slow
def test_portable_code_for_a_generic_cpu(tmp_path):
    """NUMBA_CPU_NAME=generic (baseline x86-64 / aarch64, no AVX): the vector compress and the float16
    rounding then compile to generic code, which must give the same bytes (serial kernel, both word sizes)."""
    code = (
        "from modelinit_server.engine import Sampler, reference, cpu\n"
        "for s in (Sampler('normal', std=1e-4), Sampler('trunc_normal', std=1.0, b=-5.5),\n"
        "          Sampler('trunc_normal', std=0.02, a=-2.0, b=2.0), Sampler('uniform', low=-1e-5, high=1e-5)):\n"
        "    for dt in ('float32', 'bfloat16', 'float16'):\n"
        "        for st, n in ((3, 10007), (2**40 + 1, 9)):\n"
        "            assert cpu.generate(s, (1, 2), st, n, dt, threads=1) == reference.generate(s, (1, 2), st, n, dt), (s, dt)\n"
        "print('same bytes')\n"
    )
    out = _run_py(code, {"NUMBA_CPU_NAME": "generic", "NUMBA_CACHE_DIR": str(tmp_path)})
    assert "same bytes" in out


def _tiny_kernel(out, count, start, k0, k1, kind, dt, mean, std, a, b, plo, pw, flip, nchunks):
    out[0] = count


def test_cache_failure_at_first_call_compiles_without_cache(tmp_path, monkeypatch):
    """A cache that cannot be written (full disk, permissions changed) must not fail the request."""
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))
    d = numba.njit(cache=True, **cpu.JIT_OPTIONS)(_tiny_kernel)

    def broken_save(sig, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(d._cache, "save_overload", broken_save)
    view = np.zeros(4, np.uint16)
    with pytest.warns(UserWarning, match="numba cache failed"):
        cpu._launch(d, view, 7, 0, *cpu._kernel_args(Sampler("normal"), (0, 0), "bfloat16"), 1)
    assert view[0] == 7
    cpu._launch(d, view, 9, 0, *cpu._kernel_args(Sampler("normal"), (0, 0), "bfloat16"), 1)
    assert view[0] == 9
