"""End to end, side by side, in one run: spec -> shards on disk.

    python benchmarks/end_to_end.py [--model tinyllama-1.1b] [--skip-hf] [--memory-7b]

1. the embedded default (`modelinit init`, in-process engine) vs transformers `from_config` +
   `save_pretrained` (../shared/bench/hf_baseline.py, TinyLlama shape, bf16);
2. a separately started server + the CLI client vs the raw gRPC loopback ceiling for the same
   bytes, 1 MiB messages, written to a file (../shared/bench/grpc_ceiling.py);
3. (--memory-7b) llama-2-7b bf16 through a separately started server to disk: peak RSS of server
   and client.
Every command runs as its own process; peak RSS is read from /proc (VmHWM) or getrusage.
Not a test: it prints figures and ratios (record them in docs/performance.md).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "bench"
PY = sys.executable


def timed(cmd: list[str], env=None) -> tuple[float, str, int]:
    """Wall seconds, stdout, and the child's peak RSS in bytes."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - t
    if r.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # max over children so far
    return elapsed, r.stdout, peak if peak > before * 1024 else -1


class Server:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([PY, "-m", "modelinit.cli", "serve", "--host", "127.0.0.1", "--port", "0"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        self.target = "127.0.0.1:" + re.search(r":(\d+) ", line).group(1)
        self.peak = 0
        self._watch = threading.Thread(target=self._poll, daemon=True)
        self._watch.start()

    def _poll(self) -> None:
        status = pathlib.Path(f"/proc/{self.proc.pid}/status")
        while self.proc.poll() is None:
            try:
                m = re.search(r"VmHWM:\s+(\d+) kB", status.read_text())
                self.peak = max(self.peak, int(m.group(1)) * 1024)
            except (OSError, AttributeError):
                pass
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def client_peak(cmd: list[str]) -> tuple[float, int]:
    """Run a client command, sampling its VmHWM."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = 0
    while p.poll() is None:
        try:
            m = re.search(r"VmHWM:\s+(\d+) kB", pathlib.Path(f"/proc/{p.pid}/status").read_text())
            peak = max(peak, int(m.group(1)) * 1024)
        except (OSError, AttributeError):
            pass
        time.sleep(0.2)
    if p.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr.read()}")
    return time.perf_counter() - t, peak


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tinyllama-1.1b")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--memory-7b", action="store_true")
    args = ap.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="modelinit-bench-"))
    init = [PY, "-m", "modelinit.cli", "init", args.model, "--seed", "0", "--dtype", "bfloat16", "--quiet"]
    print(f"machine: {os.cpu_count()} cores; model {args.model} bf16; scratch {work}")

    # Warm the numba cache so that no run pays the compile.
    subprocess.run(init + ["--out", str(work / "warm")], check=True, capture_output=True)
    shutil.rmtree(work / "warm")

    t_emb, out, rss_emb = timed(init + ["--out", str(work / "emb")])
    nbytes = sum(p.stat().st_size for p in (work / "emb").glob("*.safetensors"))
    params = nbytes // 2
    shutil.rmtree(work / "emb")
    print(f"embedded default:   {t_emb:6.2f} s  {params / t_emb / 1e6:7.0f} M params/s  {nbytes / t_emb / 1e9:5.2f} GB/s  "
          f"peak RSS {rss_emb / 1e9:.2f} GB")

    if not args.skip_hf:
        _, out, _ = timed([PY, str(SHARED / "hf_baseline.py"), "llama-1b"])
        t_hf = float(re.search(r"total ([\d.]+)s", out).group(1))
        print(f"transformers:       {t_hf:6.2f} s  ({out.strip()})")
        print(f"  -> embedded is {t_hf / t_emb:.1f}x faster than transformers init+save (goal >= 5x)")

    server = Server()
    try:
        t_srv, _ = client_peak(init + ["--server", server.target, "--out", str(work / "srv")])
    finally:
        server.stop()
    shutil.rmtree(work / "srv")
    _, out, _ = timed([PY, str(SHARED / "grpc_ceiling.py"), str(1 << 20), str(nbytes), "file"])
    ceiling = float(re.search(r"([\d.]+) GB/s", out).group(1))
    served = nbytes / t_srv / 1e9
    print(f"served + client:    {t_srv:6.2f} s  {served:5.2f} GB/s; raw gRPC ceiling (1 MiB, file sink) {ceiling:.2f} GB/s")
    print(f"  -> {served / ceiling:.0%} of the loopback ceiling (goal >= 70%)")

    if args.memory_7b:
        server = Server()
        try:
            t7, client_rss = client_peak([PY, "-m", "modelinit.cli", "init", "llama-2-7b", "--seed", "0", "--dtype",
                                          "bfloat16", "--quiet", "--server", server.target, "--out", str(work / "7b")])
        finally:
            server.stop()
        size = sum(p.stat().st_size for p in (work / "7b").glob("*.safetensors"))
        shutil.rmtree(work / "7b")
        print(f"llama-2-7b served:  {t7:6.1f} s  {size / t7 / 1e9:5.2f} GB/s; peak RSS server {server.peak / 1e9:.2f} GB, "
              f"client {client_rss / 1e9:.2f} GB (goal <= 1.5 GB each)")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
