"""End to end, side by side, in one run: spec -> shards on disk.

    python benchmarks/end_to_end.py [--model tinyllama-1.1b] [--reps 3] [--hf-reps 2] [--dir D] [--memory-7b] [--cold]
                                    [--device auto|cpu|cuda]

1. the embedded default (`modelinit init`, in-process engine) vs transformers `from_config` +
   `save_pretrained` (benchmarks/baselines/hf_init_save.py, same preset, bf16), and the strongest
   plain PyTorch loop (benchmarks/baselines/torch_loop.py: `torch.empty(shape, bf16).normal_()`
   per tensor + `safetensors.torch.save_file`);
2. a separately started server + the CLI client vs the raw gRPC loopback ceiling for the same
   bytes, 1 MiB messages, into the same O_DIRECT file writer and into a discard sink
   (benchmarks/baselines/grpc_ceiling.py), rep by rep in turn; the ceiling times only its stream
   (after its imports and its server's start), so the library call `Client(target).init_model` is
   also timed alone, in a process of its own, beside the CLI's whole process. One server serves
   every rep, so only its first request hashes the shards (it remembers their digests); the
   first request is reported apart, and ``--cold`` starts a fresh server for every rep instead;
3. (--memory-7b) llama-2-7b bf16 through a separately started server to disk: peak RSS of server
   and client.
Every command runs as its own process, after a sync; peak RSS is sampled from /proc (VmHWM).
Disk writes on shared VMs vary a lot run to run: each figure is the best and the median of reps.
Not a test: it prints figures and ratios (record them in docs/performance.md).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from floor import byte_compile  # run as a script: benchmarks/ is on sys.path

REPO = pathlib.Path(__file__).resolve().parents[1]
BASELINES = REPO / "benchmarks" / "baselines"
PY = sys.executable


#: A client process that times only ``init_model`` (after its imports and the channel's creation), as
#: grpc_ceiling.py times only its stream: argv = target, model, out.
LIBRARY_CALL = """
import sys, time
import modelinit
with modelinit.Client(sys.argv[1]) as c:
    t = time.perf_counter()
    c.init_model(sys.argv[2], seed=0, dtype="bfloat16", out_dir=sys.argv[3])
    print(time.perf_counter() - t)
"""


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(cmd: list[str]) -> tuple[float, str, int, float]:
    """Wall seconds, stdout, peak RSS (VmHWM, sampled) and CPU seconds of a command, after a sync
    so that the previous run's dirty pages do not slow this one's writes."""
    os.sync()
    cpu = children_cpu()
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    status = pathlib.Path(f"/proc/{p.pid}/status")
    while p.poll() is None:
        try:
            peak = max(peak, int(re.search(r"VmHWM:\s+(\d+) kB", status.read_text()).group(1)) * 1024)
        except (OSError, AttributeError):
            pass
        time.sleep(0.05)
    elapsed = time.perf_counter() - t
    out, err = p.communicate()
    if p.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{out}\n{err}")
    return elapsed, out, peak, children_cpu() - cpu


def best_median(xs: list[float]) -> str:
    return f"best {min(xs):6.2f} s, median {statistics.median(xs):6.2f} s"


class Server:
    def __init__(self, device: str = "auto") -> None:
        self.proc = subprocess.Popen([PY, "-m", "modelinit.cli", "serve", "--host", "127.0.0.1", "--port", "0",
                                      "--device", device],
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

    def cpu(self) -> float:
        """CPU seconds (user + system) the server has used so far."""
        fields = pathlib.Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)




def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tinyllama-1.1b", help="a preset or a config.json (each run and baseline takes it)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each modelinit run (best and median)")
    ap.add_argument("--hf-reps", type=int, default=2, help="repetitions of the transformers baseline")
    ap.add_argument("--dir", default=None, help="scratch folder for every output (default: the system temp dir)")
    ap.add_argument("--memory-7b", action="store_true")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="the engine of the embedded job and of the server (default auto: CUDA if present)")
    ap.add_argument("--cold", action="store_true",
                    help="a fresh server for every rep, so that each served run is a first request (the server hashes)")
    args = ap.parse_args()
    byte_compile()
    work = pathlib.Path(tempfile.mkdtemp(prefix="modelinit-bench-", dir=args.dir))
    env_tmp = {**os.environ, "TMPDIR": str(work)}  # the baselines write where we write
    init = [PY, "-m", "modelinit.cli", "init", args.model, "--seed", "0", "--dtype", "bfloat16", "--quiet"]
    embedded = init + ["--device", args.device]
    print(f"machine: {os.cpu_count()} cores; model {args.model} bf16; scratch {work}")

    run(embedded + ["--out", str(work / "warm")])  # fills the numba cache: no run below pays the compile
    nbytes = sum(p.stat().st_size for p in (work / "warm").glob("*.safetensors"))
    shutil.rmtree(work / "warm")

    emb, rss = [], 0
    for _ in range(args.reps):
        t, _, peak, _ = run(embedded + ["--out", str(work / "emb")])
        emb.append(t)
        rss = max(rss, peak)
        shutil.rmtree(work / "emb")
    print(f"embedded default:     {best_median(emb)}  ({nbytes / min(emb) / 1e9:.2f} GB/s best; peak RSS {rss / 1e9:.2f} GB)")

    if args.hf_reps:
        for label, script, goal in (("transformers", "hf_init_save.py", 5), ("plain PyTorch loop", "torch_loop.py", 3)):
            times, out = [], ""
            for _ in range(args.hf_reps):
                os.sync()
                out = subprocess.run([PY, str(BASELINES / script), args.model], capture_output=True, text=True,
                                     env=env_tmp, check=True).stdout
                times.append(float(re.search(r"total ([\d.]+)s", out).group(1)))
            print(f"{label + ':':<22}{best_median(times)}  ({out.strip()})")
            print(f"  -> embedded / {label}: {min(times) / min(emb):.1f}x (best vs best), "
                  f"{statistics.median(times) / statistics.median(emb):.1f}x (median vs median); goal >= {goal}x")

    # Interleaved, rep by rep (served, library call, ceiling into the file, ceiling into discard), so
    # that the machine's drift over the minutes this takes hits every figure alike.
    server = Server(args.device)
    srv, lib, srv_cpu, client_cpu = [], [], [], []
    ceil, discard, ceil_cpu = [], [], []
    try:
        for rep in range(args.reps):
            if args.cold and rep:
                server.stop()
                server = Server(args.device)  # a server that has hashed nothing: every rep is a first request
            before = server.cpu()
            t, _, _, cpu = run(init + ["--server", server.target, "--out", str(work / "srv")])
            srv.append(t)
            srv_cpu.append(server.cpu() - before)
            client_cpu.append(cpu)
            shutil.rmtree(work / "srv")
            _, out, _, _ = run([PY, "-c", LIBRARY_CALL, server.target, args.model, str(work / "lib")])
            lib.append(float(out.split()[-1]))
            shutil.rmtree(work / "lib")
            for sink, into in (("direct", ceil), ("discard", discard)):
                os.sync()
                cpu = children_cpu()
                out = subprocess.run([PY, str(BASELINES / "grpc_ceiling.py"), str(1 << 20), str(nbytes), sink],
                                     capture_output=True, text=True, env=env_tmp, check=True).stdout
                into.append(float(re.search(r"([\d.]+) GB/s", out).group(1)))
                if sink == "direct":
                    ceil_cpu.append(children_cpu() - cpu)
    finally:
        server.stop()
    served = [nbytes / t / 1e9 for t in srv]
    served_lib = [nbytes / t / 1e9 for t in lib]
    cores = os.cpu_count() or 1
    print(f"served + CLI client:  {best_median(srv)}  ({max(served):.2f} GB/s best; server peak RSS {server.peak / 1e9:.2f} GB)")
    # The server remembers the digest of every shard it hashed whole (modelinit_server.produce.digests):
    # its first request hashes each byte, the repeats of the same model hash nothing.
    if args.cold:
        print("  (--cold: a fresh server for every rep: each served run above hashed every byte on the server)")
    print(f"  first request of the fresh server (it hashes): {srv[0]:.2f} s, {served[0] / statistics.median(ceil):.0%} of the "
          f"median ceiling; server CPU {srv_cpu[0]:.2f} s")
    if len(srv) > 1 and not args.cold:
        print(f"  repeats (the shards' digests known): {best_median(srv[1:])}, "
              f"{statistics.median(served[1:]) / statistics.median(ceil):.0%} of the median ceiling (median vs median); "
              f"server CPU median {statistics.median(srv_cpu[1:]):.2f} s")
    print(f"  CPU (medians): server {statistics.median(srv_cpu):.2f} s + client {statistics.median(client_cpu):.2f} s "
          f"= {statistics.median(srv_cpu) + statistics.median(client_cpu):.2f} core-s, "
          f"{(statistics.median(srv_cpu) + statistics.median(client_cpu)) / cores / statistics.median(srv):.0%} "
          f"of {cores} cores over the median wall")
    print(f"  the library call alone (Client(target).init_model, timed as the ceiling times its stream): {best_median(lib)}")
    print(f"raw gRPC ceiling:     best {max(ceil):.2f} GB/s, median {statistics.median(ceil):.2f} GB/s (1 MiB messages, "
          f"O_DIRECT file sink; {statistics.median(ceil_cpu):.2f} core-s, start-up included); discard sink best "
          f"{max(discard):.2f} GB/s, median {statistics.median(discard):.2f} GB/s")
    print(f"  -> served / ceiling: {max(served) / max(ceil):.0%} (best vs best), "
          f"{statistics.median(served) / statistics.median(ceil):.0%} (median vs median); goal >= 70%")
    print(f"     the library call / ceiling, both without process start-up: {max(served_lib) / max(ceil):.0%} (best vs best), "
          f"{statistics.median(served_lib) / statistics.median(ceil):.0%} (median vs median)")

    if args.memory_7b:
        server = Server(args.device)
        try:
            t7, _, client_rss, _ = run([PY, "-m", "modelinit.cli", "init", "llama-2-7b", "--seed", "0", "--dtype", "bfloat16",
                                     "--quiet", "--server", server.target, "--out", str(work / "7b")])
        finally:
            server.stop()
        size = sum(p.stat().st_size for p in (work / "7b").glob("*.safetensors"))
        shutil.rmtree(work / "7b")
        print(f"llama-2-7b served:    {t7:6.1f} s  {size / t7 / 1e9:5.2f} GB/s; peak RSS server {server.peak / 1e9:.2f} GB, "
              f"client {client_rss / 1e9:.2f} GB (goal <= 1.5 GB each)")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
