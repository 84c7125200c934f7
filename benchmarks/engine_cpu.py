"""Throughput of the numba CPU kernel next to torch's in-place initializers (and the numpy reference).

    python benchmarks/engine_cpu.py                 # 64M elements, 1 and 2 threads, best of 3
    python benchmarks/engine_cpu.py --n 16M --threads 1 2 4 --no-reference

Prints M elements/s. Kernel: ``engine.cpu.generate_into`` into a preallocated byte buffer (the server's
use), for normal(std=0.02), trunc_normal(std=0.02, a=-2, b=2) and uniform(-0.05, 0.05) into bfloat16 and
float32 (and float16 with ``--dtypes``). torch, at the same thread count (``torch.set_num_threads``) on a
preallocated float32 tensor: ``normal_``, ``nn.init.trunc_normal_(std=0.02, a=-0.04, b=0.04)`` (the same
+-2 sigma interval in absolute units) and ``uniform_``, each also followed by ``.to(torch.bfloat16)``.
The ratio is kernel / torch for the same output dtype (the bfloat16 kernel against torch's float32
op + ``.to(bfloat16)``). The numpy reference (single-threaded) is shown for context on fewer elements.
This is a measurement, not a test: nothing is asserted.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "server"))

import numpy as np  # noqa: E402
from modelinit_server.engine import Sampler, reference, cpu, tensor_key  # noqa: E402

SAMPLERS = {
    "normal": Sampler("normal", std=0.02),
    "trunc_normal": Sampler("trunc_normal", std=0.02, a=-2.0, b=2.0),
    "uniform": Sampler("uniform", low=-0.05, high=0.05),
}


def _count(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text[:-1] if text[-1:] in "KMG" else text) * mult


def best_rate(fn, n: int, repeat: int) -> float:
    """M elements/s of the fastest of ``repeat`` runs of ``fn()`` producing ``n`` elements."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return n / best / 1e6


def torch_ops(torch, x):
    nn = torch.nn.init
    return {
        "normal": lambda: x.normal_(0.0, 0.02),
        "trunc_normal": lambda: nn.trunc_normal_(x, mean=0.0, std=0.02, a=-0.04, b=0.04),
        "uniform": lambda: x.uniform_(-0.05, 0.05),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="64M", help="elements per run (default 64M)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], choices=reference.DTYPES)
    ap.add_argument("--kinds", nargs="+", default=list(SAMPLERS), choices=list(SAMPLERS))
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--reference-n", default="4M", help="elements per numpy reference run (default 4M)")
    args = ap.parse_args()
    n = _count(args.n)
    key = tensor_key(0, "benchmark.weight")

    import numba

    t = time.perf_counter()
    cpu.warmup()
    print(f"# numba {numba.__version__}, {os.cpu_count()} CPUs, NUMBA_NUM_THREADS={numba.config.NUMBA_NUM_THREADS}, "
          f"warmup (compile or cache load) {time.perf_counter() - t:.2f} s, threading layer ", end="")
    cpu.generate(SAMPLERS["normal"], key, 0, 4 * cpu.SERIAL_MAX, "float32", threads=1 if os.cpu_count() == 1 else 2)
    print(numba.threading_layer())
    print(f"# n = {n:,} elements, best of {args.repeat}; M elements/s")

    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            print("# torch not installed: kernel only")
    x = torch.empty(n, dtype=torch.float32) if torch is not None else None

    header = f"{'threads':>7} {'kind':<13} {'dtype':<9} {'kernel':>9} {'torch':>9} {'ratio':>7}   torch op"
    print(header)
    print("-" * len(header))
    for th in args.threads:
        if torch is not None:
            torch.set_num_threads(th)
        for kind in args.kinds:
            sampler = SAMPLERS[kind]
            trate = {}
            if torch is not None:
                op = torch_ops(torch, x)[kind]
                trate["float32"] = best_rate(op, n, args.repeat)
                trate["bfloat16"] = best_rate(lambda: op().to(torch.bfloat16), n, args.repeat)
                trate["float16"] = best_rate(lambda: op().to(torch.float16), n, args.repeat)
            for dtype in args.dtypes:
                buf = np.empty(n * reference.DTYPE_ITEMSIZE[dtype], dtype=np.uint8)
                krate = best_rate(lambda: cpu.generate_into(buf, sampler, key, 0, n, dtype, threads=th), n, args.repeat)
                buf = None  # free it before the next dtype
                if dtype in trate:
                    tname = {"normal": "normal_", "trunc_normal": "trunc_normal_", "uniform": "uniform_"}[kind]
                    if dtype != "float32":
                        tname += f" + .to({dtype})"
                    print(f"{th:>7} {kind:<13} {dtype:<9} {krate:>9.1f} {trate[dtype]:>9.1f} {krate / trate[dtype]:>6.1f}x   {tname}")
                else:
                    print(f"{th:>7} {kind:<13} {dtype:<9} {krate:>9.1f}")
                sys.stdout.flush()

    if not args.no_reference:
        rn = _count(args.reference_n)
        print(f"# numpy reference engine.generate_array (single thread), n = {rn:,}")
        for kind in args.kinds:
            for dtype in args.dtypes:
                rate = best_rate(lambda: reference.generate_array(SAMPLERS[kind], key, 0, rn, dtype), rn, args.repeat)
                print(f"{'ref':>7} {kind:<13} {dtype:<9} {rate:>9.1f}")


if __name__ == "__main__":
    main()
