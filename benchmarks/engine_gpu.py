"""Throughput of the Triton GPU kernel (engine/cuda.py) against two yardsticks on the same device.

For normal / trunc_normal / uniform into bfloat16 and float32 it prints elements/s and output bytes/s of
``cuda.generate_into`` and compares them with

* a device-to-device copy (``dst.copy_(src)``) of the same output size: the memory-bandwidth ceiling for
  writing those bytes (the copy also reads them, so it is a conservative yardstick);
* torch's ``normal_`` into a tensor of the same dtype and element count (not bit-reproducible, and
  Box-Muller in float32: the speed of "just random numbers" on this GPU).

Run only where CUDA exists (exits with a message otherwise)::

    python benchmarks/engine_gpu.py [--elements 268435456] [--repeats 10] [--block 1024] [--warps 8]

``--block`` / ``--warps`` override ``cuda.BLOCK`` / ``cuda.NUM_WARPS`` (speed knobs only: the bytes never
depend on them). Timings use CUDA events around ``--repeats`` launches after one warm-up launch.
"""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--elements", type=int, default=1 << 28, help="elements per launch (default 2**28)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--block", type=int, default=None, help="elements per Triton program (power of two)")
    ap.add_argument("--warps", type=int, default=None, help="warps per Triton program")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--kinds", default="normal,trunc_normal,uniform")
    args = ap.parse_args(argv)

    try:
        import torch
        from modelinit_server.engine import DTYPE_ITEMSIZE, Sampler, cuda, tensor_key
    except ImportError as e:
        print(f"engine_gpu: cannot import torch / the engine ({e}); nothing to benchmark", file=sys.stderr)
        return 1
    if cuda.interpreting() or not cuda.available():
        print("engine_gpu: no CUDA device (or triton missing, or TRITON_INTERPRET=1); nothing to benchmark",
              file=sys.stderr)
        return 1
    if args.warps is not None:
        cuda.NUM_WARPS = args.warps

    samplers = {
        "normal": Sampler("normal", std=0.02),
        "trunc_normal": Sampler("trunc_normal", std=0.02, a=-2.0, b=2.0),
        "uniform": Sampler("uniform", low=-0.05, high=0.05),
    }
    tdtype = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
    n, reps = args.elements, args.repeats
    key = tensor_key(0, "bench")
    major, minor = torch.cuda.get_device_capability()
    print(f"device: {torch.cuda.get_device_name()} (sm_{major}{minor}), {n:,} elements per launch, "
          f"{reps} repeats, block {args.block or cuda.BLOCK}, warps {cuda.NUM_WARPS}")
    problems = cuda.ptx_problems(cuda.ptx("trunc_normal", "bfloat16", capability=10 * major + minor, block=args.block))
    print(f"PTX check (trunc_normal -> bfloat16, sm_{major}{minor}): {'clean' if not problems else problems}")

    def timed(fn) -> float:
        fn()  # warm-up (compilation, allocation)
        torch.cuda.synchronize()
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        for _ in range(reps):
            fn()
        t1.record()
        torch.cuda.synchronize()
        return t0.elapsed_time(t1) / 1e3 / reps  # seconds per call

    header = f"{'kind':<13} {'dtype':<9} {'Gelem/s':>9} {'GB/s out':>9} {'copy GB/s':>10} {'vs copy':>8} " \
             f"{'normal_ Gelem/s':>16} {'vs normal_':>11}"
    print(header)
    print("-" * len(header))
    for dtype in args.dtypes.split(","):
        itemsize = DTYPE_ITEMSIZE[dtype]
        nbytes = n * itemsize
        out = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        t_copy = timed(lambda: dst.copy_(src))
        ref = torch.empty(n, dtype=tdtype[dtype], device="cuda")
        t_normal = timed(lambda: ref.normal_(0.0, 0.02))
        for kind in args.kinds.split(","):
            s = samplers[kind]
            t = timed(lambda: cuda.generate_into(out, s, key, 0, n, dtype, block=args.block))
            print(f"{kind:<13} {dtype:<9} {n / t / 1e9:>9.2f} {nbytes / t / 1e9:>9.1f} {nbytes / t_copy / 1e9:>10.1f} "
                  f"{t / t_copy:>7.1f}x {n / t_normal / 1e9:>16.2f} {t / t_normal:>10.1f}x")
        out = src = dst = ref = None  # free them before empty_cache
        torch.cuda.empty_cache()
    print("'vs copy' / 'vs normal_': the kernel's time divided by the yardstick's (1.0x = as fast).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
