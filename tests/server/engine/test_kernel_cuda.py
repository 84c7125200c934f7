"""The Triton GPU kernel (engine/cuda.py) against the numpy reference: bit for bit.

Without a GPU the kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``: numpy on CPU tensors). The
interpreter must be switched on before triton is imported, and other tests in this pytest process may
already have imported it, so those checks run in a subprocess (this file run as a module, see the bottom)
that prints one JSON object. The interpreter verifies the transcription of the algorithm (operation
order, constants, branches, bit manipulation, counter layout, indexing, zero rows, validation); the GPU's
code generation is checked on the PTX (compiled for sm_90 without a GPU) and, where CUDA exists, by the
GPU tests at the end (the same tables, plus >= 1e9 elements per dtype against the CPU kernel).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import pathlib
import random
import re
import subprocess
import sys

import numpy as np
import pytest

triton = pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from modelinit_server.engine import (  # noqa: E402
    DTYPE_ITEMSIZE,
    Sampler,
    reference,
    cuda,  # noqa: E402
    tensor_key,
)

try:
    import tests.support  # noqa: F401
except ImportError:  # run as a script from elsewhere: the repository's root makes `tests` importable
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
from tests.support import REPO  # noqa: E402
from tests.support.golden import GOLDEN  # noqa: E402

HAS_CUDA = torch.cuda.is_available() and not cuda.interpreting()


# ------------------------------------------------------------------------------------------------
# Case tables (shared by the interpreter and the GPU runs)
# ------------------------------------------------------------------------------------------------


def _golden_cases() -> list[dict]:
    return [
        dict(id=f"golden-{cid}", seed=seed, name=name, sampler=kw, dtype=dtype, start=start, count=count, digest=digest)
        for cid, seed, name, kw, dtype, start, count, digest in GOLDEN
    ]


_SAMPLERS = [
    dict(kind="normal"),
    dict(kind="normal", std=0.02),
    dict(kind="normal", mean=-3.25, std=7.5),
    dict(kind="normal", mean=1e-3, std=1e-6),  # values packed around 1e-3: many ties after rounding
    dict(kind="normal", std=1e-6),  # float16 subnormals
    dict(kind="normal", std=1e-40),  # float32 subnormals (and zeros in bf16/fp16 rounding paths)
    dict(kind="normal", std=10337.0),  # largest std float16 accepts
    dict(kind="normal", std=11000.0),  # refused for float16 (ValueError from both)
    dict(kind="trunc_normal", std=0.02, a=-2.0, b=2.0),
    dict(kind="trunc_normal", mean=0.5, std=3.0, a=-0.5, b=3.0),  # asymmetric, flip
    dict(kind="trunc_normal", a=-3.0, b=0.5),  # no flip
    dict(kind="trunc_normal", b=-6.0),  # lower tail, r > 5 branch
    dict(kind="trunc_normal", b=-7.0),  # deep lower tail: every element in the far branch
    dict(kind="trunc_normal", a=5.0),  # upper tail, reflected
    dict(kind="trunc_normal", a=7.0),  # deep upper tail, reflected, far branch
    dict(kind="trunc_normal", a=-2.5, b=-2.4),  # narrow, lower side
    dict(kind="trunc_normal", a=2.4, b=2.5),  # narrow, reflected
    dict(kind="trunc_normal", a=0.5, b=0.5 + 1e-10),  # tiny mass: the z guards clamp last-ulp cases
    dict(kind="trunc_normal", a=-1e-10, b=1e-10),
    dict(kind="trunc_normal", a=-3.0),  # a + inf > 0: reflected to [-inf, 3]
    dict(kind="trunc_normal", b=3.0),  # a = -inf: never reflected
    dict(kind="trunc_normal", mean=-1.0, std=2.0),  # [-inf, inf]: a + b is NaN, no flip
    dict(kind="trunc_normal", a=-40.0, b=40.0),  # Phi = 0 / 1 exactly
    dict(kind="trunc_normal", mean=3.0, std=0.5, a=6.9, b=9.0),
    dict(kind="uniform"),
    dict(kind="uniform", low=-0.05, high=0.05),
    dict(kind="uniform", low=-1e-7, high=1e-7),  # float16 subnormals
    dict(kind="uniform", low=1e30, high=3e30),  # fine in float32/bf16, refused for float16
    dict(kind="uniform", low=-65504.0, high=65504.0),
    dict(kind="constant", value=1.0 / 3.0),
    dict(kind="constant", value=-2.5),
    dict(kind="constant", value=1e-40),  # float32 subnormal
    dict(kind="constant", value=1.0 + 2**-8 + 2**-30),  # bf16 double-rounding tie
    dict(kind="constant", value=6.0e-8),  # float16 subnormal rounding
    dict(kind="constant", value=0.0),
]

#: Programs at most for a block under 1,024 (the interpreter's cost is per program). Eight still give
#: a partial first and last program and full ones between, the boundaries a block size has; 25 did
#: the same with three times the interpreter's time (the small blocks were 15 of a part's 18 s).
SMALL_BLOCK_PROGRAMS = 8
_STARTS = [0, 1, 2, 3, 5, 1023, 4097, 2**32 - 2, 2**34 - 7, 2**34 + 1, 2**40 + 3, 2**62 - 5000]
_COUNTS = [0, 1, 2, 3, 4, 5, 7, 63, 64, 65, 1000, 1023, 1024, 1025, 2049, 3001]
_BLOCKS = [None, None, None, 4, 8, 64, 256, 2048, 4096]


def _random_cases(n: int = 400, seed: int = 20240611) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for k in range(n):
        kw = dict(rng.choice(_SAMPLERS)) if k >= len(_SAMPLERS) else dict(_SAMPLERS[k])
        dtype = rng.choice(reference.DTYPES)
        start = rng.choice(_STARTS) if rng.random() < 0.6 else rng.randrange(0, 2**rng.choice([8, 20, 33, 50, 62]))
        count = rng.choice(_COUNTS) if rng.random() < 0.7 else rng.randrange(0, 6000)
        block = rng.choice(_BLOCKS)
        if block is not None and block < 1024:  # a program costs the interpreter ~30 ms whatever its block
            count = min(count, SMALL_BLOCK_PROGRAMS * block)
        start = min(start, 2**62 - count)
        if rng.random() < 0.3:  # padding row somewhere around the slice
            row_size = rng.choice([1, 3, 64, 1000, 4096])
            row = max(0, (start + rng.randrange(-2 * row_size, count + 2 * row_size)) // row_size)
            kw.update(zero_row=row, row_size=row_size)
        elif rng.random() < 0.05:
            kw.update(zero_row=2**70, row_size=7)  # far beyond any index
        cases.append(dict(
            id=f"rand-{k}", seed=rng.randrange(2**64), name=f"layer.{k}.weight" if k % 7 else f"ünï.{k}",
            sampler=kw, dtype=dtype, start=start, count=count, block=block,
            soft_cvt=rng.random() < 0.3, offset=rng.choice([0, 0, 0, 1, 2, 3]),
        ))
    # a few larger slices (several programs, block boundaries, mixed branches)
    big = [
        (dict(kind="normal", std=0.02), "bfloat16", 12345, 150_003, None),
        (dict(kind="trunc_normal", std=0.02, a=-2.0, b=2.0), "float16", 2**33 + 1, 100_001, 65536),
        (dict(kind="trunc_normal", a=6.0), "float32", 7, 60_000, 16384),
        (dict(kind="trunc_normal", b=-6.5), "bfloat16", 2**40 + 2, 60_000, 16384),
        (dict(kind="uniform", low=-1.0, high=2.0), "float32", 2**62 - 70_000, 70_000, 8192),
        (dict(kind="normal", mean=0.1, std=1.5, zero_row=5, row_size=4096), "float32", 3, 40_000, None),
    ]
    for j, (kw, dtype, start, count, block) in enumerate(big):
        cases.append(dict(id=f"big-{j}", seed=j, name="big", sampler=kw, dtype=dtype, start=start, count=count,
                          block=block, soft_cvt=j % 2 == 1, offset=0))
    for j, (kw, start, count) in enumerate(_CLAMP_CASES):
        cases.append(dict(id=f"clamp-{j}", seed=0, name="clamp", sampler=kw, dtype="float32", start=start,
                          count=count, block=None, soft_cvt=False, offset=0))
    return cases


#: trunc_normal slices (seed 0, name "clamp") where the z guards fire: z < a and z > b, with and without
#: reflection (found with the reference). ``mean`` cancels the bound, ``v = mean + std * z`` is then a small
#: difference, so a guard's last-ulp change of z is visible in float32 (otherwise it would round away).
#: test_random_table_covers_the_cases_that_matter re-checks that each guard changes output bits here.
_CLAMP_CASES = [
    (dict(kind="trunc_normal", mean=-0.3, a=0.3, b=0.3 + 1e-11), 19_600, 30_000),  # reflected: both guards
    (dict(kind="trunc_normal", mean=3.0, a=-3.0 - 1e-9, b=-3.0), 48_400, 20),  # not reflected, z > b
    (dict(kind="trunc_normal", a=-1e-10, b=1e-10), 339_780, 20),  # not reflected, z < a
]


def _guard_effects(kw: dict, start: int, count: int) -> tuple[int, int]:
    """Elements whose float32 output bits change because of the z < a guard, and because of the z > b guard
    (computed with the reference's arithmetic, dropping one guard at a time)."""
    from modelinit_server.engine.sampler import U2_MAX
    from modelinit_server.engine.special import normal_ppf

    s = Sampler(**kw)
    plo, _, pw, flip = s.trunc_scalars
    z = normal_ppf(np.minimum(plo + reference.uniforms(tensor_key(0, "clamp"), start, count) * pw, U2_MAX))
    z = -z if flip else z
    lo_only = np.where(z < s.a, s.a, z)
    hi_only = np.where(z > s.b, s.b, z)
    both = np.where(lo_only > s.b, s.b, lo_only)
    f32 = lambda zz: (s.mean + s.std * zz).astype(np.float32).view(np.uint32)  # noqa: E731
    return int((f32(both) != f32(hi_only)).sum()), int((f32(both) != f32(lo_only)).sum())


# ------------------------------------------------------------------------------------------------
# Running a table (in the interpreter subprocess, or in-process on a GPU)
# ------------------------------------------------------------------------------------------------


def _first_mismatch(got: bytes, ref: bytes, itemsize: int) -> str:
    a = np.frombuffer(got, dtype=f"<u{itemsize}")
    b = np.frombuffer(ref, dtype=f"<u{itemsize}")
    if a.size != b.size:
        return f"size {a.size} != {b.size}"
    idx = np.flatnonzero(a != b)
    return f"{idx.size} elements differ, first at offset {idx[0]}: got {a[idx[0]]:#x}, ref {b[idx[0]]:#x}"


def _run_case(case: dict, device: str) -> dict:
    sampler = Sampler(**case["sampler"])
    key = tensor_key(case["seed"], case["name"])
    dtype, start, count = case["dtype"], case["start"], case["count"]
    try:
        ref, ref_err = reference.generate(sampler, key, start, count, dtype), None
    except ValueError as e:
        ref, ref_err = None, str(e)
    off = case.get("offset", 0)
    buf = torch.full((count * DTYPE_ITEMSIZE[dtype] + off + 8,), 0xA5, dtype=torch.uint8, device=device)
    out = buf[off : off + count * DTYPE_ITEMSIZE[dtype]]
    try:
        cuda.generate_into(out, sampler, key, start, count, dtype, block=case.get("block"),
                           soft_cvt=case.get("soft_cvt", False))
        got, got_err = out.cpu().numpy().tobytes(), None
    except ValueError as e:
        got, got_err = None, str(e)
    res = {"id": case["id"], "ok": True, "detail": ""}
    if ref_err is not None or got_err is not None:
        if ref_err != got_err:
            res.update(ok=False, detail=f"error mismatch: ref {ref_err!r}, kernel {got_err!r}")
        return res
    host = buf.cpu().numpy()
    if host[:off].tobytes() != b"\xa5" * off or host[off + len(got) :].tobytes() != b"\xa5" * 8:
        res.update(ok=False, detail="wrote outside out")
    elif got != ref:
        res.update(ok=False, detail=_first_mismatch(got, ref, DTYPE_ITEMSIZE[dtype]))
    elif "digest" in case and hashlib.sha256(got).hexdigest() != case["digest"]:
        res.update(ok=False, detail="golden digest mismatch")
    return res


def _check_generate_tensor(device: str) -> list[str]:
    errs = []
    s, key = Sampler("trunc_normal", std=0.02, a=-2.0, b=2.0), tensor_key(3, "t")
    for dtype, tdt in (("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        t = cuda.generate_tensor(s, key, 5, 999, dtype, device)
        if t.dtype != tdt or t.shape != (999,) or t.device.type != torch.device(device).type:
            errs.append(f"generate_tensor {dtype}: {t.dtype} {tuple(t.shape)} {t.device}")
        elif t.cpu().view(torch.uint8).numpy().tobytes() != reference.generate(s, key, 5, 999, dtype):
            errs.append(f"generate_tensor {dtype}: bytes differ")
    return errs


def _check_runs(device: str) -> list[str]:
    """generate_runs_into: the runs' bytes back to back (empty runs, a padding row, odd starts)."""
    errs = []
    key = tensor_key(4, "runs")
    cases = {None: ([5, 61, 61, 200, 7, 2**40 + 3], [40, 0, 3, 1, 1030, 77]),
             8: ([5, 61, 200, 2**40 + 3], [21, 3, 1, 13])}  # 8: several programs per run
    for s in (Sampler("normal", std=0.5, zero_row=2, row_size=30), Sampler("trunc_normal", a=1.0, b=3.0)):
        for dtype in DTYPE_ITEMSIZE:
            for block, (starts, counts) in cases.items():
                out = torch.empty(sum(counts) * DTYPE_ITEMSIZE[dtype] + 2, dtype=torch.uint8, device=device)[1:-1]
                cuda.generate_runs_into(out, s, key, starts, counts, dtype, block=block)  # misaligned: via a temporary
                want = b"".join(reference.generate(s, key, a, c, dtype) for a, c in zip(starts, counts))
                if out.cpu().numpy().tobytes() != want:
                    errs.append(f"generate_runs_into {s.kind} {dtype} block={block}: bytes differ")
    try:
        cuda.generate_runs_into(torch.empty(3, dtype=torch.uint8, device=device), s, key, [0], [2], "bfloat16")
        errs.append("generate_runs_into: no error for a short out")
    except ValueError as e:
        if not str(e).startswith("out: must hold exactly sum(counts) * itemsize = 4 bytes"):
            errs.append(f"generate_runs_into: {e}")
    return errs


def _check_out_errors(device: str) -> list[str]:
    """ValueErrors about ``out`` (after the argument checks of reference.generate)."""
    errs = []
    s, key = Sampler("normal"), (1, 2)
    bad = [
        (torch.empty(8, dtype=torch.int16, device=device), "out: must be a 1-D torch.uint8 tensor"),
        (torch.empty(15, dtype=torch.uint8, device=device), "out: must hold exactly count * itemsize = 16 bytes"),
        (torch.empty(2, 8, dtype=torch.uint8, device=device), "out: must be a 1-D torch.uint8 tensor"),
        (torch.empty(32, dtype=torch.uint8, device=device)[::2], "out: must be contiguous"),
        (np.empty(16, dtype=np.uint8), "out: must be a 1-D torch.uint8 tensor"),
    ]
    for out, msg in bad:
        try:
            cuda.generate_into(out, s, key, 0, 8, "bfloat16")
            errs.append(f"no error for {msg!r}")
        except ValueError as e:
            if not str(e).startswith(msg):
                errs.append(f"{str(e)!r} does not start with {msg!r}")
    return errs


# ------------------------------------------------------------------------------------------------
# Interpreter-only checks of the kernel's building blocks
# ------------------------------------------------------------------------------------------------


def _interp_building_blocks() -> dict:
    import triton.language as tl

    @triton.jit
    def philox_kernel(ctr_ptr, key_ptr, out_ptr):
        offs = tl.arange(0, 4)
        c = tl.load(ctr_ptr + offs * 4 + 0).to(tl.uint32, bitcast=True)
        c1 = tl.load(ctr_ptr + offs * 4 + 1).to(tl.uint32, bitcast=True)
        c2 = tl.load(ctr_ptr + offs * 4 + 2).to(tl.uint32, bitcast=True)
        c3 = tl.load(ctr_ptr + offs * 4 + 3).to(tl.uint32, bitcast=True)
        k0 = tl.load(key_ptr + offs * 2).to(tl.uint32, bitcast=True)
        k1 = tl.load(key_ptr + offs * 2 + 1).to(tl.uint32, bitcast=True)
        x0, x1, x2, x3 = cuda._philox4x32_10(c, c1, c2, c3, k0, k1)
        tl.store(out_ptr + offs * 4 + 0, x0.to(tl.int32, bitcast=True))
        tl.store(out_ptr + offs * 4 + 1, x1.to(tl.int32, bitcast=True))
        tl.store(out_ptr + offs * 4 + 2, x2.to(tl.int32, bitcast=True))
        tl.store(out_ptr + offs * 4 + 3, x3.to(tl.int32, bitcast=True))

    @triton.jit
    def f16_kernel(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        b = tl.load(src + offs, mask=m).to(tl.uint32, bitcast=True)
        tl.store(dst + offs, cuda._f32_to_f16_bits(b).to(tl.int16, bitcast=True), mask=m)

    @triton.jit
    def f32_kernel(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(dst + offs, cuda._f64_to_f32_bits(tl.load(src + offs, mask=m)).to(tl.int32, bitcast=True), mask=m)

    @triton.jit
    def ppf_kernel(src, dst, n, FAR: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(dst + offs, cuda._normal_ppf(tl.load(src + offs, mask=m, other=0.5), FAR), mask=m)

    @triton.jit
    def randint_kernel(out_ptr):
        x0, x1, x2, x3 = tl.randint4x(0, tl.zeros([4], tl.int64))
        tl.store(out_ptr + tl.arange(0, 4), x0.to(tl.int32, bitcast=True))

    res: dict = {"errors": []}
    errs = res["errors"]
    B = 1 << 18

    # Philox known answers (Random123), counters with non-zero words 2 and 3 included
    kat = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
           ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
           ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    kat = kat + [kat[0]]
    ctr = torch.from_numpy(np.array([k[0] for k in kat], dtype=np.uint32).reshape(-1).view(np.int32).copy())
    keys = torch.from_numpy(np.array([k[1] for k in kat], dtype=np.uint32).reshape(-1).view(np.int32).copy())
    out = torch.empty(16, dtype=torch.int32)
    philox_kernel[(1,)](ctr, keys, out)
    got = out.numpy().view(np.uint32).reshape(4, 4)
    for row, (_, _, want) in zip(got, kat):
        if tuple(int(v) for v in row) != want:
            errs.append(f"philox KAT: got {[hex(v) for v in row]}, want {[hex(v) for v in want]}")
    r = torch.empty(4, dtype=torch.int32)
    randint_kernel[(1,)](r)
    res["randint4x_00"] = hex(int(r.numpy().view(np.uint32)[0]))

    # float32 -> float16 bits against numpy: every float16 boundary (exact values, midpoints, +-1 float32
    # ulp, both signs, subnormal range included) and a random sample of all float32 patterns
    h = np.arange(0, 0x7C01, dtype=np.uint16).view(np.float16).astype(np.float32)
    hn = np.nextafter(h, np.float32(np.inf))
    mids = ((h.astype(np.float64)[:-1] + h.astype(np.float64)[1:]) / 2).astype(np.float32)  # exact in float32
    pats = [h, hn, mids, np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(np.inf)),
            np.array([65504.0, 65519.996, 65520.0, 1e5, np.inf, 2.0**-25, 2.0**-24, 1e-40, 0.0], np.float32)]
    rnd = np.random.default_rng(7).integers(0, 2**32, size=B, dtype=np.uint64).astype(np.uint32).view(np.float32)
    pats.append(rnd[~np.isnan(rnd)])
    f = np.concatenate(pats)
    f = np.concatenate([f, -f])
    src = torch.from_numpy(f.view(np.int32).copy())
    dst = torch.empty(f.size, dtype=torch.int16)
    f16_kernel[(triton.cdiv(f.size, B),)](src, dst, f.size, BLOCK=B)
    with np.errstate(over="ignore"):
        want = f.astype(np.float16).view(np.int16)
    res["f16_checked"] = int(f.size)
    if (dst.numpy() != want).any():
        i = int(np.flatnonzero(dst.numpy() != want)[0])
        errs.append(f"f32->f16 bits: {f[i]!r} ({f.view(np.uint32)[i]:#x}) -> {dst.numpy()[i] & 0xFFFF:#x}, want {want[i] & 0xFFFF:#x}")

    # float64 -> float32 bits: every float32 boundary region sampled, midpoints (ties), +-1 float64 ulp
    b32 = np.random.default_rng(8).integers(0, 0x7F800000, size=B // 4, dtype=np.uint64).astype(np.uint32)
    b32 = np.concatenate([b32, np.arange(0, 4096, dtype=np.uint32), np.arange(0x7F7FF000, 0x7F800000, dtype=np.uint32),
                          np.arange(0x007FF000, 0x00801000, dtype=np.uint32)])
    lo = b32.view(np.float32).astype(np.float64)
    hi = np.nextafter(b32.view(np.float32), np.float32(np.inf)).astype(np.float64)
    mid = (lo + hi) / 2
    x = np.concatenate([lo, mid, np.nextafter(mid, 0.0), np.nextafter(mid, np.inf), np.nextafter(lo, 0.0),
                        np.array([1e300, 2.0**128, 3.4028235677973366e38, 3.4028235677973362e38, 2.0**-150,
                                  2.0**-150 * (1 + 2**-52), 2.0**-151, 5e-324, 0.0])])
    x = np.concatenate([x, -x])
    src = torch.from_numpy(x.copy())
    dst = torch.empty(x.size, dtype=torch.int32)
    f32_kernel[(triton.cdiv(x.size, B),)](src, dst, x.size, BLOCK=B)
    with np.errstate(over="ignore"):
        want = x.astype(np.float32).view(np.int32)
    res["f32_checked"] = int(x.size)
    if (dst.numpy() != want).any():
        i = int(np.flatnonzero(dst.numpy() != want)[0])
        errs.append(f"f64->f32 bits: {x[i]!r} -> {dst.numpy()[i] & 0xFFFFFFFF:#x}, want {want[i] & 0xFFFFFFFF:#x}")

    # normal_ppf (both FAR settings) against the reference on uniforms over the whole range and deep tails
    from modelinit_server.engine.special import normal_ppf

    rng = np.random.default_rng(9)
    u = np.concatenate([
        (rng.integers(0, 2**32, size=B // 2).astype(np.float64) + 0.5) * 2.0**-32,
        np.array([2.0**-33, 1 - 2.0**-33, 0.075, 0.925, 0.5 - 0.425, 0.5 + 0.425, 0.07500000000000001]),
    ])
    deep = np.concatenate([10.0 ** -rng.uniform(10.8, 22, size=B // 4), 1 - 2.0**-53 * np.arange(1, 200)])
    for far, p in ((False, u), (True, np.concatenate([u, deep]))):
        src = torch.from_numpy(p.copy())
        dst = torch.empty(p.size, dtype=torch.float64)
        ppf_kernel[(triton.cdiv(p.size, B),)](src, dst, p.size, FAR=far, BLOCK=B)
        want = normal_ppf(p)
        if dst.numpy().tobytes() != want.tobytes():
            i = int(np.flatnonzero(dst.numpy().view(np.int64) != want.view(np.int64))[0])
            errs.append(f"normal_ppf(FAR={far}): p={p[i]!r} -> {dst.numpy()[i]!r}, want {want[i]!r}")
    return res


def _patch_once_per_launch() -> None:
    """The interpreter patches triton.language for a launch (its grid runs under the patch, undone at
    the end), then again on every device-function call inside it, each time over every member of
    the language modules (``inspect.getmembers``): a third of the random table's time. Inside a
    launch, a device function whose modules the launch patched is run without patching again: the
    same patch, so the same values (a device function's patch is never undone, so one that patched a
    module the launch did not, triton.language.standard's ``core``, holds for the rest of the
    launch); outside one, as the interpreter does. Left as it is where the
    interpreter's private names moved (a slower run, never a different one)."""
    import threading

    from triton.runtime import interpreter

    grid_call, patch = getattr(interpreter.GridExecutor, "__call__", None), getattr(interpreter, "_patch_lang", None)
    if grid_call is None or patch is None or not hasattr(interpreter, "_LangPatchScope"):
        return
    launch = threading.local()

    def langs(fn) -> frozenset[int]:
        return frozenset(id(v) for v in fn.__globals__.values() if v is triton.language or v is triton.language.core)

    def patch_lang(fn):
        patched = getattr(launch, "langs", None)
        if patched is not None and langs(fn) <= patched:
            return interpreter._LangPatchScope()  # nothing to undo: the launch's patch holds
        scope = patch(fn)
        if getattr(launch, "open", False):  # the launch's own patch, or a device function's other module
            launch.langs = langs(fn) | (patched or frozenset())
        return scope

    def call(self, *args, **kwargs):
        launch.open, launch.langs = True, None
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            launch.open, launch.langs = False, None

    interpreter._patch_lang = patch_lang
    interpreter.GridExecutor.__call__ = call


def _worker(mode: str) -> dict:
    """Entry point of the interpreter subprocess: run one group of checks, return a JSON-able dict."""
    assert cuda.interpreting() and cuda.available(), "worker needs TRITON_INTERPRET=1"
    _patch_once_per_launch()
    if mode == "golden":
        return {"results": [_run_case(c, "cpu") for c in _golden_cases()]}
    if mode.startswith("random:"):  # random:K:N, part K of N: every N-th case; part 0 also the other checks
        k, n = map(int, mode.split(":")[1:])
        return {"results": [_run_case(c, "cpu") for c in _random_cases()[k::n]],
                "errors": _check_generate_tensor("cpu") + _check_out_errors("cpu") + _check_runs("cpu") if k == 0 else []}
    if mode == "blocks":
        return _interp_building_blocks()
    if mode == "threads":
        return {"errors": _check_threads("cpu")}
    raise ValueError(mode)


def _check_threads(device: str) -> list[str]:
    """Several threads generating at once (the embedded job's files in flight): each range's bytes."""
    import threading

    s, key, errs = Sampler("trunc_normal", std=0.02, a=-2.0, b=2.0), tensor_key(4, "threads"), []

    def work(i: int) -> None:
        try:
            for rep in range(3):
                start, count = 10_000 * i + 7 * rep, 3001 + rep
                got = cuda.generate_tensor(s, key, start, count, "bfloat16", device).view(torch.uint8).cpu().numpy()
                if got.tobytes() != reference.generate(s, key, start, count, "bfloat16"):
                    errs.append(f"thread {i}, range {start}+{count}: other bytes")
        except Exception as e:  # noqa: BLE001 - reported, not raised in the thread
            errs.append(f"thread {i}: {e!r}"[:300])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errs


def _interp(mode: str) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}
    proc = subprocess.run([sys.executable, "-m", "tests.server.engine.test_kernel_cuda", mode], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"interpreter worker failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _failures(results: list[dict]) -> list[str]:
    return [f"{r['id']}: {r['detail']}" for r in results if not r["ok"]]


# ------------------------------------------------------------------------------------------------
# Tests: interpreter (CPU) and PTX (no GPU needed)
# ------------------------------------------------------------------------------------------------


def test_run_table_covers_every_run_once():
    rng = np.random.default_rng(3)
    starts, counts = rng.integers(0, 10**6, 50), rng.integers(0, 3000, 50)
    counts[:5] = 0
    for block in (4, 8, 1024):
        table = cuda.run_table(starts, counts, block)
        assert (table[:, 3] % 4 == 0).all()
        offs = np.concatenate(([0], np.cumsum(counts)[:-1]))
        for s, c, o in zip(starts, counts, offs):
            rows = table[(table[:, 0] == s) & (table[:, 2] == o)] if c else table[:0]
            assert (rows[:, 1] == c).all()
            covered = sorted(i for b in rows[:, 3] for i in range(b, b + block) if s <= i < s + c)
            assert covered == list(range(s, s + c))


@pytest.mark.slow
def test_interpreter_golden():
    res = _interp("golden")
    assert len(res["results"]) == len(GOLDEN)
    assert _failures(res["results"]) == []


#: The random table runs as this many parts, each in an interpreter process of its own (parallel
#: test workers share it; about 70 s on one core in all).
RANDOM_PARTS = 3


@pytest.mark.slow
@pytest.mark.parametrize("k", range(RANDOM_PARTS))
def test_interpreter_random_table(k):
    res = _interp(f"random:{k}:{RANDOM_PARTS}")
    assert len(res["results"]) == len(_random_cases()[k::RANDOM_PARTS])
    assert _failures(res["results"]) == []
    assert res["errors"] == []


@pytest.mark.slow
def test_interpreter_building_blocks():
    res = _interp("blocks")
    assert res["errors"] == []
    assert res["randint4x_00"] == "0x6627e8d5"  # the interpreter computes Random123's known answer
    assert res["f16_checked"] > 200_000 and res["f32_checked"] > 300_000


@pytest.mark.slow
def test_interpreter_several_threads_at_once():
    """Launches from several threads (the embedded job's files in flight) are serialized: each gets
    its own range's bytes (unserialized, the interpreter fails: "Did you forget to add @triton.jit?")."""
    assert _interp("threads")["errors"] == []


def test_random_table_covers_the_cases_that_matter():
    """Guard the table itself: every kind and dtype, reflected and far-tail trunc_normal, unaligned and huge
    starts, counts around the block size, zero rows, soft conversions, misaligned outputs, refusals."""
    cases = _random_cases()
    assert {c["sampler"]["kind"] for c in cases} == {"normal", "trunc_normal", "uniform", "constant"}
    assert {c["dtype"] for c in cases} == set(reference.DTYPES)
    trunc = [Sampler(**c["sampler"]) for c in cases if c["sampler"]["kind"] == "trunc_normal"]
    assert any(s.trunc_scalars.flip for s in trunc) and any(not s.trunc_scalars.flip for s in trunc)
    assert any(s.trunc_scalars.phi < math.exp(-25) for s in trunc)  # far branch (r > 5) for every element
    assert any(c["start"] % 4 for c in cases) and any(c["start"] >= 2**62 - 70_000 for c in cases)
    assert any(c["start"] // 4 >= 2**32 for c in cases)  # counter word 1 non-zero
    assert any(c["count"] == 0 for c in cases) and any(c["count"] > 100_000 for c in cases)
    small = [c for c in cases if c["block"] is not None and c["block"] < 1024]  # several programs of each small block
    assert {c["block"] for c in small if c["count"] > (SMALL_BLOCK_PROGRAMS - 1) * c["block"]} == {4, 8, 64, 256}
    assert any(c["sampler"].get("zero_row") is not None for c in cases)
    assert any(c["soft_cvt"] for c in cases) and any(c["offset"] % 2 for c in cases)
    effects = [(_guard_effects(kw, start, count), Sampler(**kw).trunc_scalars.flip) for kw, start, count in _CLAMP_CASES]
    assert effects[0][0][0] > 0 and effects[0][0][1] > 0 and effects[0][1]  # reflected: z < a and z > b
    assert effects[1][0][1] > 0 and not effects[1][1]  # not reflected: z > b
    assert effects[2][0][0] > 0 and not effects[2][1]  # not reflected: z < a
    refused = 0
    for c in cases:
        try:
            reference.check_dtype(Sampler(**c["sampler"]), c["dtype"])
        except ValueError:
            refused += 1
    assert refused >= 2


def test_validation_matches_reference():
    """Bad arguments give reference.generate's ValueError (checked before anything touches torch tensors)."""
    s, key = Sampler("normal"), (1, 2)
    out = torch.empty(16, dtype=torch.uint8)
    bad = [
        (("not a sampler", key, 0, 8, "float32")),
        ((s, (1, 2, 3), 0, 8, "float32")),
        ((s, (2**32, 0), 0, 8, "float32")),
        ((s, key, -1, 8, "float32")),
        ((s, key, 0, -8, "float32")),
        ((s, key, 2**62, 1, "float32")),
        ((s, key, True, 8, "float32")),
        ((s, key, 0, 8, "float64")),
        ((Sampler("normal", std=11000.0), key, 0, 8, "float16")),
    ]
    for args in bad:
        with pytest.raises(ValueError) as ref:
            reference.generate(*args)
        with pytest.raises(ValueError) as got:
            cuda.generate_into(out, *args)
        assert str(got.value) == str(ref.value)
        with pytest.raises(ValueError) as got:
            cuda.generate_tensor(*args)
        assert str(got.value) == str(ref.value)
    with pytest.raises(ValueError, match="block"):
        cuda.generate_into(torch.empty(16, dtype=torch.uint8), s, key, 0, 4, "float32", block=3)


@pytest.mark.skipif(HAS_CUDA, reason="CPU-only behaviour")
def test_cpu_tensor_refused_without_interpreter():
    if cuda.interpreting():
        pytest.skip("interpreter on in this process")
    with pytest.raises(ValueError, match="out: must be on a CUDA device"):
        cuda.generate_into(torch.empty(16, dtype=torch.uint8), Sampler("normal"), (1, 2), 0, 4, "float32")
    assert cuda.available() is False


def test_one_run_takes_the_range_kernel(monkeypatch):
    """A whole tensor (or a row-block shard) is one run: the range kernel fills it, with no program
    table (an 8B model's table was 250 MB of host work per init_module_ on an H100); several runs
    take the runs kernel. Launches recorded, not run: this holds with or without a GPU."""
    if cuda.triton is None:
        pytest.skip("triton is not installed")
    calls = []
    monkeypatch.setattr(cuda, "_check_device", lambda out: None)
    monkeypatch.setattr(cuda, "_with_device", lambda view, launch: launch())
    monkeypatch.setattr(cuda, "_launch", lambda view, s, k, start, count, *a: calls.append(("range", start, count)))
    monkeypatch.setattr(cuda, "_launch_runs", lambda view, s, k, starts, counts, *a: calls.append(("runs", len(starts))))
    out = torch.empty(200, dtype=torch.uint8)
    cuda.generate_runs_into(out, Sampler("normal"), (1, 2), [0, 500, 9], [0, 100, 0], "bfloat16")
    cuda.generate_runs_into(out, Sampler("normal"), (1, 2), [0, 500], [40, 60], "bfloat16")
    assert calls == [("range", 500, 100), ("runs", 2)]


def test_engine_import_does_not_import_torch_or_triton():
    code = ("import sys, modelinit_server.engine, modelinit_server.engine.reference; "
            "print(int('torch' in sys.modules), int('triton' in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "0"]


def test_auto_without_a_gpu_imports_neither_torch_nor_triton():
    """``device=auto`` on a machine whose driver reports no GPU picks the CPU kernel without importing
    triton or torch (triton alone was a sixth of a second of every embedded job's start)."""
    from modelinit_server.engine import gpu_driver

    if gpu_driver.may_have_gpu():
        pytest.skip("the CUDA driver reports a device here")
    code = ("import sys; from modelinit_server.engine.backends import select; b = select('auto'); "
            "print(b.name, int('torch' in sys.modules), int('triton' in sys.modules))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**env, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[1:] == ["0", "0"]


_PTX_SPECS = [("normal", False), ("trunc_normal", False), ("trunc_normal", True), ("uniform", False), ("constant", False)]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", reference.DTYPES)
def test_ptx_is_bit_exact(dtype):
    """Compile for sm_90 (no GPU needed): no FMA, no approximate division/sqrt, no transcendental, no FTZ,
    float64 mul/add with explicit .rn (not contractible by ptxas), the spec's cvt instructions."""
    if cuda.interpreting():
        pytest.skip("TRITON_INTERPRET=1 in this process")
    try:
        texts = {(k, f): cuda.ptx(k, dtype, flip=f) for k, f in _PTX_SPECS}
        texts[("normal-soft", False)] = cuda.ptx("normal", dtype, soft_cvt=True)
        for k, f in _PTX_SPECS:  # the runs kernel: the same element code behind a table load
            texts[(f"{k}-runs", f)] = cuda.ptx(k, dtype, flip=f, runs=True)
    except Exception as e:  # pragma: no cover - a triton without the CUDA backend / ptxas
        pytest.skip(f"cannot compile for CUDA here: {type(e).__name__}: {e}")
    for (kind, flip), text in texts.items():
        assert cuda.ptx_problems(text) == [], (kind, flip)
        if kind in ("normal", "trunc_normal", "normal-soft", "normal-runs", "trunc_normal-runs"):
            for ins in ("div.rn.f64", "sqrt.rn.f64", "mul.rn.f64", "add.rn.f64", "sub.rn.f64", "mul.hi.u32"):
                assert ins in text, (kind, ins)
        if kind == "normal-soft":
            assert "cvt.rn.f32.f64" not in text and "cvt.rn.f16.f32" not in text
        else:
            assert "cvt.rn.f32.f64" in text
            assert ("cvt.rn.f16.f32" in text) == (dtype == "float16")


def test_ptx_constants_are_exact_float64():
    """Every float64 constant of the algorithm appears in the compiled code with its exact binary64 bits
    (or negated: LLVM writes ``x - c`` as ``x + (-c)``, the same IEEE operation), so none went through
    float32 on the way (the interpreter cannot show this: it does not use the compiler's constants)."""
    import struct

    from modelinit_server.engine import special as sp
    from modelinit_server.engine.sampler import U2_MAX

    if cuda.interpreting():
        pytest.skip("TRITON_INTERPRET=1 in this process")
    try:
        text = cuda.ptx("trunc_normal", "bfloat16", flip=True)
    except Exception as e:  # pragma: no cover
        pytest.skip(f"cannot compile for CUDA here: {type(e).__name__}: {e}")
    vals = [*sp.AS241_A, *sp.AS241_B, *sp.AS241_C, *sp.AS241_D, *sp.AS241_E, *sp.AS241_F, *sp.LOG_C[1:],
            sp.LN2_HI, sp.LN2_LO, sp.SQRT_HALF, 0.180625, 0.425, 1.6, 5.0, 0.5, U2_MAX, 2.0**-32]

    def lit(x: float) -> str:
        return "0d%016X" % struct.unpack("<Q", struct.pack("<d", x))[0]

    missing = [v for v in vals if lit(v) not in text and lit(-v) not in text]
    assert missing == []
    # the thresholds are compared as float64 (triton 3.6 rounded a comparison's scalar constant to
    # float32: 0.425 -> 0.42500001, sqrt(1/2) -> 0.70710677, U2_MAX -> 1.0, seen on an H100)
    compared = {m.group(1) for m in re.finditer(r"setp\.\w+\.f64\s+%p\d+, %\w+, (0d[0-9A-F]{16})", text)}
    assert {lit(0.425), lit(sp.SQRT_HALF), lit(U2_MAX)} <= compared, sorted(compared)


def test_ptx_problems_flags_bad_instructions():
    bad = ("fma.rn.f64 %fd1, %fd2, %fd3, %fd4;\n div.full.f32 %f1, %f2, %f3;\n sqrt.approx.f32 %f1, %f2;\n"
           " lg2.approx.f32 %f1, %f2;\n cvt.rn.ftz.f32.f64 %f1, %fd1;\n mul.f64 %fd1, %fd2, %fd3;\n"
           " call.uni (retval0), __nv_log, (param0);")
    found = " ".join(cuda.ptx_problems(bad))
    for s in ("fma.rn.f64", "div.full", "sqrt.approx", "lg2.approx", ".ftz", "mul.f64", "call"):
        assert s in found
    assert cuda.ptx_problems("div.rn.f64 %fd1, %fd2, %fd3;\n mul.rn.f64 %fd1, %fd2, %fd3;\n") == []


# ------------------------------------------------------------------------------------------------
# Tests on a real GPU (skipped without CUDA)
# ------------------------------------------------------------------------------------------------

needs_gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


@needs_gpu
def test_gpu_golden():
    assert _failures([_run_case(c, "cuda") for c in _golden_cases()]) == []


#: The GPU's random table in parts (every GPU_RANDOM_PARTS-th case), so that parallel workers share it: its
#: time is Triton compiling the kernel's variants (ptxas, one CPU core each), over 190 s in one test on an
#: H200 node with other tests beside it (2026-11-28).
GPU_RANDOM_PARTS = 8


@needs_gpu
@pytest.mark.parametrize("k", range(GPU_RANDOM_PARTS))
def test_gpu_random_table(k):
    assert _failures([_run_case(c, "cuda") for c in _random_cases()[k::GPU_RANDOM_PARTS]]) == []
    if k == 0:
        assert _check_generate_tensor("cuda") == []
        assert _check_out_errors("cuda") == []
        assert _check_runs("cuda") == []


@needs_gpu
def test_gpu_ptx_for_this_device():
    major, minor = torch.cuda.get_device_capability()
    for kind, flip in _PTX_SPECS:
        assert cuda.ptx_problems(cuda.ptx(kind, "bfloat16", flip=flip, capability=10 * major + minor)) == []


def _cpu_chunks(sampler: Sampler, key, start: int, count: int, dtype: str, chunk: int):
    """Reference bytes of [start, start + count) in chunks: the numba kernel if present, else the numpy
    reference in a process pool (bounded window, in order)."""
    try:
        from modelinit_server.engine import cpu
    except ImportError:
        cpu = None
    itemsize = DTYPE_ITEMSIZE[dtype]
    offs = list(range(0, count, chunk))
    if cpu is not None and cpu.available():
        for off in offs:
            n = min(chunk, count - off)
            buf = np.empty(n * itemsize, dtype=np.uint8)
            cpu.generate_into(buf, sampler, key, start + off, n, dtype)
            yield off, buf.tobytes()
        return
    from concurrent.futures import ProcessPoolExecutor

    workers = os.cpu_count() or 2
    with ProcessPoolExecutor(workers) as pool:
        pending = []
        for off in offs:
            pending.append((off, pool.submit(reference.generate, sampler, key, start + off, min(chunk, count - off), dtype)))
            if len(pending) >= 2 * workers:
                o, fut = pending.pop(0)
                yield o, fut.result()
        for o, fut in pending:
            yield o, fut.result()


@needs_gpu
@pytest.mark.parametrize("dtype", reference.DTYPES)
@pytest.mark.parametrize("kw", [dict(kind="normal", std=0.02), dict(kind="trunc_normal", std=0.02, a=-2.0, b=2.0),
                                dict(kind="uniform", low=-0.1, high=0.1)], ids=["normal", "trunc_normal", "uniform"])
def test_gpu_billion_elements(kw, dtype):
    """>= 1e9 elements in one launch (byte offsets past 2**31, counters crossing 2**32), compared chunk by
    chunk with the CPU kernel (or the reference), and as SHA-256 of the whole streams."""
    sampler, key = Sampler(**kw), tensor_key(2024, f"billion.{dtype}")
    count = 2**30 + 12345
    start = 2**34 - 2**29 + 3  # unaligned; counter c = i // 4 crosses 2**32 halfway
    itemsize = DTYPE_ITEMSIZE[dtype]
    dev = torch.empty(count * itemsize, dtype=torch.uint8, device="cuda")
    cuda.generate_into(dev, sampler, key, start, count, dtype)
    torch.cuda.synchronize()
    chunk = 2**25
    h_gpu, h_cpu = hashlib.sha256(), hashlib.sha256()
    for off, ref in _cpu_chunks(sampler, key, start, count, dtype, chunk):
        got = dev[off * itemsize : off * itemsize + len(ref)].cpu().numpy().tobytes()
        h_gpu.update(got)
        h_cpu.update(ref)
        assert got == ref, f"chunk at element {start + off}: {_first_mismatch(got, ref, itemsize)}"
    assert h_gpu.hexdigest() == h_cpu.hexdigest()


@needs_gpu
def test_gpu_slices_concatenate():
    """Any partition of a range into slices, generated in any order, concatenates to the same bytes."""
    s, key = Sampler("trunc_normal", a=-3.0, b=1.0), tensor_key(1, "slices")
    whole = cuda.generate_tensor(s, key, 10, 1_000_003, "bfloat16").view(torch.uint8).cpu()
    cuts = sorted({0, 1_000_003, *random.Random(5).sample(range(1, 1_000_003), 40)})
    bounds = list(zip(cuts[:-1], cuts[1:]))
    parts = {a: cuda.generate_tensor(s, key, 10 + a, b - a, "bfloat16").view(torch.uint8).cpu()
             for a, b in reversed(bounds)}  # generated back to front
    assert torch.equal(torch.cat([parts[a] for a, _ in bounds]), whole)



@needs_gpu
def test_gpu_several_threads_at_once():
    assert _check_threads("cuda") == []


if __name__ == "__main__":
    print(json.dumps(_worker(sys.argv[1])))
