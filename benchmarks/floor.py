"""The embedded job against the machine's floor, in one run (issue 22's first goal).

    python benchmarks/floor.py [--model tinyllama-1.1b] [--dtype bfloat16] [--reps 3] [--dir D] [--json F]
                               [--device auto|cpu|cuda]

The floor is the longer of
  (a) generating the same elements with the project's kernel (``--device``: the CPU kernel at full
      thread count, or on a GPU the Triton kernel plus its device-to-host copy into pinned memory;
      the plan's samplers and keys, into one reused page-aligned 8 MiB buffer, as the embedded
      engine fills its segments) plus one SHA-256 of the same number of bytes divided by the core count
      (the hash runs beside generation on another core at best), and
  (b) an ``O_DIRECT`` write of the same number of bytes from one aligned 8 MiB buffer into a file
      in ``--dir`` (the sink the embedded writer uses);
and the job is ``modelinit init MODEL --dtype D --seed 0 --device DEV --quiet --out DIR`` as a child process,
start-up included, after a ``sync``. Every figure is the median of ``--reps``; the job's output
is checked (modelinit.json present, total size = the plan's). It prints each part, the floor and
the ratio job / floor (goal: <= 1.25), then how much of the job is its start-up (a process that
only imports what the job imports and loads the kernel) and the rest against the floor.
``--timeline``: one in-process job instead, each stage timed where it runs (fills, writes, SHA-256
updates wherever they run, the writer's waits).
"""
from __future__ import annotations

import argparse
import compileall
import hashlib
import json
import mmap
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SEGMENT = 8 << 20


def plan_of(model: str, dtype: str):
    from modelinit_server.architectures import from_preset
    from modelinit_server.core import policies
    from modelinit_server.core.planner import Request, build_plan

    return build_plan(Request(from_preset(model), policies.Policy(), seed=0, dtype=dtype))


def generation_seconds(plan, device: str) -> float:
    """Every tensor's elements, in segments of at most SEGMENT bytes, into one reused aligned buffer
    (pinned where the backend allocates its own, as the embedded engine's)."""
    from modelinit_server.engine import DTYPE_ITEMSIZE
    from modelinit_server.engine.backends import select

    import numpy as np

    backend = select(device, warmup=True)
    item = DTYPE_ITEMSIZE[plan.request.dtype]
    buf = backend.alloc(SEGMENT) if backend.alloc else np.frombuffer(mmap.mmap(-1, SEGMENT), dtype=np.uint8)
    per = SEGMENT // item
    t0 = time.perf_counter()
    for t in plan.tensors:
        n = t.spec.numel
        for start in range(0, n, per):
            count = min(per, n - start)
            backend.fill(buf[: count * item], t.sampler, t.key, start, count, plan.request.dtype)
    return time.perf_counter() - t0


def sha256_seconds(nbytes: int) -> float:
    block = os.urandom(SEGMENT)
    h = hashlib.sha256()
    t0 = time.perf_counter()
    for _ in range(nbytes // SEGMENT):
        h.update(block)
    h.update(block[: nbytes % SEGMENT])
    return time.perf_counter() - t0


def odirect_seconds(nbytes: int, folder: str) -> float:
    raw = mmap.mmap(-1, SEGMENT)  # page-aligned
    raw.write(os.urandom(SEGMENT))
    path = os.path.join(folder, "odirect.bin")
    os.sync()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_DIRECT", 0), 0o644)
    try:
        t0 = time.perf_counter()
        written = 0
        while written < nbytes:
            written += os.write(fd, raw)
        os.fsync(fd)
        return time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)


def job_seconds(model: str, dtype: str, folder: str, total: int, device: str) -> float:
    out = os.path.join(folder, "out")
    shutil.rmtree(out, ignore_errors=True)
    os.sync()
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "modelinit.cli", "init", model, "--dtype", dtype, "--seed", "0", "--quiet",
                    "--device", device, "--out", out], check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    files = [p for p in pathlib.Path(out).iterdir() if p.is_file()]
    if not (pathlib.Path(out) / "modelinit.json").exists() or sum(p.stat().st_size for p in files) < total:
        raise SystemExit("the job's output is incomplete")
    shutil.rmtree(out)
    return wall


#: A process that only starts as the job does: the interpreter, the CLI's and the engine's imports,
#: the kernel's load (its parallel and its serial launch, as the job's first segments make them), no
#: teardown (the CLI ends with os._exit too). argv: the device.
STARTUP = """
import os, sys
import numpy as np
import modelinit.cli
from modelinit_server.engine import Sampler
from modelinit_server.engine.backends import select
backend, out = select(sys.argv[1]), np.empty(40000, np.uint8)
backend.fill(out, Sampler("normal"), (0, 0), 0, 20000, "bfloat16")
if backend.fill_beside is not None:
    backend.fill_beside(out[:200], Sampler("normal"), (0, 0), 0, 100, "bfloat16", 1)
sys.stdout.flush()
os._exit(0)
"""


def startup_seconds(device: str) -> float:
    """Wall seconds of a process that does only the job's start-up (:data:`STARTUP`)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", STARTUP, device], check=True)
    return time.perf_counter() - t0


def timeline(model: str, dtype: str, folder: str) -> None:
    """One embedded job in this process, each stage timed where it runs: the producer's fills (wall and
    its thread's CPU), the writer's ``O_DIRECT`` writes, the SHA-256 updates, and the writer waiting
    for the producer's next event. Prints where the wall time goes."""
    import threading

    import modelinit
    from modelinit.destinations import direct_file
    from modelinit.destinations import folder as folder_writer
    from modelinit_server.service import embedded

    lock = threading.Lock()
    acc: dict[str, float] = {}

    def add(key: str, value: float) -> None:
        with lock:
            acc[key] = acc.get(key, 0.0) + value

    select = embedded.select  # the name the embedded engine calls (imported from engine.backends)

    def timed_select(*a, **k):
        backend = select(*a, **k)
        fill = backend.fill

        def timed_fill(*args):
            w, c = time.perf_counter(), time.thread_time()
            fill(*args)
            add("fill wall", time.perf_counter() - w)
            add("fill thread CPU", time.thread_time() - c)

        object.__setattr__(backend, "fill", timed_fill)
        return backend

    write = direct_file.DirectFile.write

    def timed_write(self, data):
        w = time.perf_counter()
        write(self, data)
        add("write wall", time.perf_counter() - w)

    events_of = folder_writer.write_files  # the name FolderWriter.write calls

    def timed_write_files(source, *a, **k):
        class Timed:
            def __iter__(self):
                it = iter(source)
                while True:
                    w = time.perf_counter()
                    try:
                        item = next(it)
                    except StopIteration:
                        return
                    add("writer waits for the next event", time.perf_counter() - w)
                    yield item

            def close(self):
                source.close()

        return events_of(Timed(), *a, **k)

    import hashlib as _hashlib

    sha = _hashlib.sha256

    class TimedSha:
        def __init__(self):
            self.h = sha()

        def update(self, data):
            w = time.perf_counter()
            self.h.update(data)
            add("sha256 update wall", time.perf_counter() - w)

        def hexdigest(self):
            return self.h.hexdigest()

    from modelinit import stream
    from modelinit_server.produce import file_bytes

    embedded.select = timed_select
    direct_file.DirectFile.write = timed_write
    folder_writer.write_files = timed_write_files
    import types

    # the producer's hasher (file_bytes) and the writer's (StreamCheck.sha256, when it hashes), nobody else's
    stream.hashlib = file_bytes.hashlib = types.SimpleNamespace(sha256=TimedSha)
    out = os.path.join(folder, "timeline")
    shutil.rmtree(out, ignore_errors=True)
    os.sync()
    c0, w0 = time.process_time(), time.perf_counter()
    try:
        with modelinit.Client() as client:
            client.init_model(model, seed=0, out_dir=out, dtype=dtype)
    finally:
        embedded.select, direct_file.DirectFile.write, folder_writer.write_files = select, write, events_of
        stream.hashlib = file_bytes.hashlib = _hashlib
        shutil.rmtree(out, ignore_errors=True)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    print(f"timeline of one in-process job ({model} {dtype}): {wall:.2f} s wall, {cpu:.2f} s CPU (all threads)")
    for k, v in sorted(acc.items(), key=lambda kv: -kv[1]):
        print(f"  {k:36s} {v:7.2f} s")



def byte_compile() -> None:
    """Compile the project's sources to bytecode first, as an install does (pip compiles every
    module of a wheel): an editable install run with PYTHONDONTWRITEBYTECODE=1 (as on the CI
    machines) never writes them, and each job would compile its modules again (~0.1 s)."""
    root = pathlib.Path(__file__).resolve().parents[1]
    for part in ("client", "server", "proto"):
        compileall.compile_dir(str(root / part), quiet=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tinyllama-1.1b")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the O_DIRECT file and the job's folder go (default: a temp dir)")
    parser.add_argument("--json", default="")
    parser.add_argument("--timeline", action="store_true", help="only: one in-process job with each stage timed")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                        help="the kernel of (a) and the job's --device (default auto: CUDA where present)")
    args = parser.parse_args()
    byte_compile()
    if args.timeline:
        folder = args.dir or tempfile.mkdtemp(prefix="modelinit-floor-")
        os.makedirs(folder, exist_ok=True)
        timeline(args.model, args.dtype, folder)
        return 0
    cores = os.cpu_count() or 1
    plan = plan_of(args.model, args.dtype)
    nbytes = sum(t.nbytes for t in plan.tensors)
    folder = args.dir or tempfile.mkdtemp(prefix="modelinit-floor-")
    os.makedirs(folder, exist_ok=True)
    rows: dict[str, list[float]] = {"generation": [], "sha256": [], "odirect": [], "job": [], "startup": []}
    try:
        for _ in range(args.reps):
            rows["generation"].append(generation_seconds(plan, args.device))
            rows["sha256"].append(sha256_seconds(nbytes))
            rows["odirect"].append(odirect_seconds(nbytes, folder))
            rows["job"].append(job_seconds(args.model, args.dtype, folder, nbytes, args.device))
            rows["startup"].append(startup_seconds(args.device))
    finally:
        if args.dir is None:
            shutil.rmtree(folder, ignore_errors=True)
    from modelinit_server.engine.backends import select

    kernel = {"cpu": f"CPU kernel, {cores} threads", "cuda": "GPU kernel + copy to host",
              "reference": "numpy reference"}[select(args.device).name]
    med = {k: statistics.median(v) for k, v in rows.items()}
    compute = med["generation"] + med["sha256"] / cores
    floor = max(compute, med["odirect"])
    print(f"{args.model} {args.dtype}: {nbytes / 1e9:.2f} GB of tensor data, {cores} cores, median of {args.reps}")

    def row(label: str, seconds: float, extra: str = "") -> None:
        print(f"  {label:46s}{seconds:7.2f} s{extra}")

    row(f"(a) generation, {kernel}", med["generation"])
    row(f"    + one SHA-256 / {cores} cores", med["sha256"] / cores, f"   ({med['sha256']:.2f} s on one core)")
    row("    = compute floor", compute)
    row("(b) O_DIRECT write of the same bytes", med["odirect"])
    row("floor = max(a, b)", floor)
    row("modelinit init (embedded, start-up incl.)", med["job"], f"   ratio {med['job'] / floor:.2f}x (goal <= 1.25x)")
    row("    of which start-up (imports, kernel load)", med["startup"], "   (a process doing only that)")
    row("    the rest: streaming, exit", med["job"] - med["startup"], f"   {(med['job'] - med['startup']) / floor:.2f}x the floor")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"model": args.model, "dtype": args.dtype, "bytes": nbytes, "cores": cores,
                                                       "device": args.device, "runs": rows, "median": med, "floor": floor,
                                                       "ratio": med["job"] / floor}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
