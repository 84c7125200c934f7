"""One server under sustained mixed load: does it keep answering, and does it stop growing?

    python benchmarks/soak.py [--rounds 30] [--seq 8] [--clients 4] [--kills 1] [--huge-every 5]
                              [--settle 1.0] [--k 3] [--dir D] [--json F]

Starts `modelinit serve` on a free loopback port as a separate process (as benchmarks/end_to_end.py
does), then runs ``--rounds`` rounds, each of them:

1. ``--seq`` inits of tiny models (gpt2 and llama configs), one after another on one client, each
   with a new seed, into a scratch folder deleted after each;
2. at once, on ``--clients`` threads, each request on a client (a connection) of its own: two tiny
   inits per client, the plans (summaries) of llama-3-70b and mixtral-8x7b (and of deepseek-v3,
   ~45,000 tensors and ~5 s of planning, every ``--huge-every`` rounds), two Tensors calls (a slice
   and a whole tensor), a stream cancelled after its first messages, and the bad requests of
   ``BAD`` (each must be refused with its status: INVALID_ARGUMENT, or OUT_OF_RANGE for a file
   index past the end); beside them ``--kills`` client processes SIGKILLed while they receive a
   ~100 MB model.

After each round (and ``--settle`` seconds, so that cancelled streams are let go) it samples the
server's RSS, thread count (/proc/PID/status) and open file descriptors (/proc/PID/fd). Every
request's outcome is counted: ok, refused with the expected status, or unexpected (any other
status, an exception, a client that died by itself). Exit 1 if anything was unexpected or the
server died or did not stop cleanly (exit 0 on SIGTERM); growth alone does not fail it.

The trend, per metric, over the second half of the samples (the first half is warm-up: imports,
the plan cache, gRPC's and the executor's threads): the least-squares slope against the request
count, and the growth it projects over that half (slope x requests in it). The threshold is
``k`` (3) times the noise of that half, 1.4826 x the median absolute deviation of the residuals
around the line (a robust standard deviation), and at least one unit (1 fd, 1 thread, 1 page of
RSS). A growth within the threshold is "no growth beyond noise". The medians of the first and last
quarters of the samples are printed beside it. Not a test: record the figures in docs/performance.md.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import pathlib
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import grpc
import modelinit
from modelinit import ModelInitError
from modelinit_wire.v1 import modelinit_pb2 as pb
from modelinit_wire.v1 import modelinit_pb2_grpc as pb_grpc

REPO = pathlib.Path(__file__).resolve().parents[1]
PY = sys.executable
PAGE = os.sysconf("SC_PAGE_SIZE")

#: Tiny configs (as tests/support TINY): each init costs milliseconds, so the rounds are requests,
#: not bytes.
TINY = {
    "gpt2": {"model_type": "gpt2", "vocab_size": 1000, "n_embd": 64, "n_layer": 3, "n_head": 4, "n_positions": 128},
    "llama": {"model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 160, "max_position_embeddings": 128, "tie_word_embeddings": False},
}
#: ~100 MB of float32 (tests/support/medium_model.py's MEDIUM): far more than a stream's buffers on
#: both ends, so a client killed after its first 4 MB really is killed mid-stream.
MEDIUM = {**TINY["llama"], "vocab_size": 16384, "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 2,
          "num_attention_heads": 8, "num_key_value_heads": 4}
BIG_PLANS = ("llama-3-70b", "mixtral-8x7b")
HUGE_PLAN = "deepseek-v3"

#: The client process that is SIGKILLed mid-stream: it says "streaming" once 4 MB have arrived.
#: argv = target, seed, out.
VICTIM = """
import json, sys
import modelinit
got = 0
def tick(n):
    global got
    if got < 4 << 20 <= got + n:
        print("streaming", flush=True)
    got += n
with modelinit.Client(sys.argv[1], timeout=120) as c:
    c.init_model(json.loads(sys.argv[4]), seed=int(sys.argv[2]), out_dir=sys.argv[3], progress=tick, max_shard_size="16MB")
print("done", flush=True)
"""

WAIT = 120.0  # a guard against a hung call, never a measure


class Server:
    """`modelinit serve` on a free loopback port, as benchmarks/end_to_end.py's ``Server`` (and
    tests/support's ``ServerProcess``) start it; its log goes to a file, so a full pipe never
    blocks it."""

    def __init__(self, log: pathlib.Path) -> None:
        self.log = log
        self._log_file = open(log, "w")
        self.proc = subprocess.Popen([PY, "-m", "modelinit.cli", "serve", "--host", "127.0.0.1", "--port", "0"],
                                     stdout=subprocess.PIPE, stderr=self._log_file, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        line = self.proc.stdout.readline()
        m = re.search(r":(\d+) ", line)
        if not m:
            self.proc.kill()
            sys.exit(f"the server did not start: {line!r}\n{self.log_tail()}")
        self.target = f"127.0.0.1:{m.group(1)}"
        # whatever else it prints to stdout is drained, so the pipe never fills
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def sample(self) -> dict[str, float]:
        """RSS (and its anonymous part), peak RSS, threads, open fds, CPU seconds, now."""
        status = pathlib.Path(f"/proc/{self.proc.pid}/status").read_text()
        kb = {k: int(v) for k, v in re.findall(r"^(VmRSS|RssAnon|VmHWM):\s+(\d+) kB", status, re.M)}
        threads = int(re.search(r"^Threads:\s+(\d+)", status, re.M).group(1))
        fds = len(os.listdir(f"/proc/{self.proc.pid}/fd"))
        fields = pathlib.Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return {"rss_mib": kb["VmRSS"] / 1024, "anon_mib": kb["RssAnon"] / 1024, "peak_mib": kb["VmHWM"] / 1024,
                "threads": threads, "fds": fds, "cpu_s": cpu}

    def log_tail(self, n: int = 20) -> str:
        self._log_file.flush()
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> int | None:
        """SIGTERM, then its exit status (None: it had to be killed)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        self._log_file.close()
        return self.proc.returncode


class Tally:
    """Every request's outcome: (kind, what came back, whether that was what it should be)."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str, bool]] = []
        self.unexpected: list[str] = []
        self._lock = threading.Lock()

    def add(self, kind: str, got: str, expected: bool, detail: str = "") -> None:
        with self._lock:
            self.records.append((kind, got, expected))
            if not expected:
                self.unexpected.append(f"{kind}: {got} {detail}"[:500])

    def counts(self) -> dict[str, int]:
        with self._lock:
            ok = sum(1 for _, got, exp in self.records if exp and got == "ok")
            bad = sum(1 for _, _, exp in self.records if not exp)
            return {"requests": len(self.records), "ok": ok, "refused_or_cut": len(self.records) - ok - bad,
                    "unexpected": bad}

    def by_kind(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for kind, got, exp in self.records:
            label = got if exp else f"UNEXPECTED {got}"
            out.setdefault(kind, {})
            out[kind][label] = out[kind].get(label, 0) + 1
        return dict(sorted(out.items()))


def attempt(tally: Tally, kind: str, expect: str, call) -> None:
    """Run one request and record how it ended: ``expect`` is "ok" or a status code's name."""
    detail = ""
    try:
        call()
        got = "ok"
    except ModelInitError as e:
        got, detail = e.code.name, e.details
    except grpc.RpcError as e:
        got, detail = e.code().name, e.details() or ""
    except Exception as e:  # anything else is a failure of the client or the server: say what
        got, detail = f"{type(e).__name__}", str(e)
    tally.add(kind, got, got == expect, detail)


def bad_requests(target: str, scratch: pathlib.Path, seed: int) -> list[tuple[str, str, object]]:
    """(kind, the status it must get, the call): requests the server must refuse, each on a client
    of its own. ``bad_seed`` is refused by the client itself: the wire's uint64 cannot carry it."""
    tiny = TINY["gpt2"]
    out = scratch / f"bad-{seed}"

    def client(call):
        def run():
            with modelinit.Client(target, timeout=WAIT) as c:
                call(c)
        return run

    def raw(call):
        def run():
            with grpc.insecure_channel(target) as ch:
                call(ch)
        return run

    def page_size(ch):
        pb_grpc.ModelInitStub(ch).Plan(pb.PlanRequest(request=pb.ModelRequest(spec=pb.ModelSpec(preset="gpt2")),
                                                      page_size=20000), timeout=WAIT)

    def malformed(ch):
        ch.unary_unary("/modelinit.v1.ModelInit/Plan")(b"\xff\xff\xff\xff", timeout=WAIT)

    def file_past_end(ch):
        request = pb.ModelRequest(spec=pb.ModelSpec(config_json=json.dumps(tiny)), seed=seed)
        for _ in pb_grpc.ModelInitStub(ch).Init(pb.InitRequest(request=request, files=[99]), timeout=WAIT):
            pass

    inv = "INVALID_ARGUMENT"
    return [
        ("bad_preset", inv, client(lambda c: c.plan("no-such-model"))),
        ("bad_model_type", inv, client(lambda c: c.init_model({**tiny, "model_type": "no_such_type"}, seed=seed, out_dir=out))),
        ("bad_dtype", inv, client(lambda c: c.init_model(tiny, seed=seed, dtype="float8", out_dir=out))),
        ("bad_seed (client-side)", inv, client(lambda c: c.plan(tiny, seed=2**64))),
        ("over_max_params", inv, client(lambda c: c.plan({**tiny, "n_embd": 819200000}, seed=seed))),
        ("bad_shard_size", inv, client(lambda c: c.init_model(tiny, seed=seed, max_shard_size="5XB", out_dir=out))),
        ("bad_policy", inv, client(lambda c: c.plan(tiny, seed=seed, policy="no-such-policy"))),
        ("bad_tensor_name", inv, client(lambda c: c.tensors(tiny, seed=seed, names=["nope"]))),
        ("bad_page_size", inv, raw(page_size)),
        ("malformed_bytes", inv, raw(malformed)),
        ("file_index_past_end", "OUT_OF_RANGE", raw(file_past_end)),
    ]


def cancelled_stream(target: str, seed: int) -> None:
    """An Init stream of MEDIUM cancelled after its first three messages; raises its RpcError
    (CANCELLED), or returns if it ended otherwise."""
    with grpc.insecure_channel(target) as ch:
        request = pb.ModelRequest(spec=pb.ModelSpec(config_json=json.dumps(MEDIUM)), seed=seed)
        call = pb_grpc.ModelInitStub(ch).Init(pb.InitRequest(request=request), timeout=WAIT)
        for _ in range(3):
            next(call)
        call.cancel()
        for _ in call:
            pass


def killed_client(tally: Tally, target: str, scratch: pathlib.Path, seed: int) -> None:
    """A client process receiving MEDIUM, SIGKILLed once 4 MB have arrived. Expected: killed while
    streaming; a client that finished first is counted apart ("finished before the kill")."""
    out = scratch / f"victim-{seed}"
    p = subprocess.Popen([PY, "-c", VICTIM, target, str(seed), str(out), json.dumps(MEDIUM)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([p.stdout], [], [], WAIT)
        line = p.stdout.readline() if ready else ""
        if line.strip() == "streaming" and p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait(WAIT)
            tally.add("client_killed_mid_stream", "KILLED", True)
        else:
            p.wait(WAIT)
            err = p.stderr.read()
            if p.returncode == 0:
                tally.add("client_killed_mid_stream", "finished before the kill", True)
            else:
                tally.add("client_killed_mid_stream", f"client exit {p.returncode}", False, f"{line!r} {err[-300:]}")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()
        p.stderr.close()
        shutil.rmtree(out, ignore_errors=True)


def one_round(r: int, args, target: str, scratch: pathlib.Path, tally: Tally) -> None:
    base = r * 10_000  # every round's seeds are new ones
    models = list(TINY.values())
    with modelinit.Client(target, timeout=WAIT) as c:
        for i in range(args.seq):
            out = scratch / f"seq-{r}-{i}"

            def init(c=c, i=i, out=out):
                res = c.init_model(models[i % len(models)], seed=base + i, out_dir=out)
                if not res.files:
                    raise RuntimeError("no files written")
            attempt(tally, "init_sequential", "ok", init)
            shutil.rmtree(out, ignore_errors=True)

    jobs: list[tuple[str, str, object]] = []

    def on_own_client(call):
        def run():
            with modelinit.Client(target, timeout=WAIT) as c:
                call(c)
        return run

    for j in range(args.clients * 2):
        seed, out = base + 1000 + j, scratch / f"con-{r}-{j}"

        def init(c, seed=seed, out=out, model=models[j % len(models)]):
            try:
                if not c.init_model(model, seed=seed, out_dir=out).files:
                    raise RuntimeError("no files written")
            finally:
                shutil.rmtree(out, ignore_errors=True)
        jobs.append(("init_concurrent", "ok", on_own_client(init)))
    plans = list(BIG_PLANS) + ([HUGE_PLAN] if args.huge_every and r % args.huge_every == args.huge_every - 1 else [])
    for name in plans:
        def plan(c, name=name):
            if c.plan(name, seed=base + 2000).total_params < 10**10:
                raise RuntimeError(f"{name}: a plan too small")
        jobs.append((f"plan {name}", "ok", on_own_client(plan)))

    def tensor_slice(c):
        got = c.tensors(TINY["gpt2"], seed=base + 3000, slices={"transformer.wte.weight": ((0, 10), None)})
        if got["transformer.wte.weight"].shape != (10, 64):
            raise RuntimeError(f"slice of shape {got['transformer.wte.weight'].shape}")

    def tensor_whole(c):
        got = c.tensors(TINY["llama"], seed=base + 3001, names=["model.layers.0.mlp.up_proj.weight"])
        if got["model.layers.0.mlp.up_proj.weight"].shape != (160, 64):
            raise RuntimeError(f"tensor of shape {got['model.layers.0.mlp.up_proj.weight'].shape}")
    jobs += [("tensors_slice", "ok", on_own_client(tensor_slice)), ("tensors_whole", "ok", on_own_client(tensor_whole)),
             ("stream_cancelled", "CANCELLED", lambda: cancelled_stream(target, base + 4000))]
    jobs += bad_requests(target, scratch, base + 5000)
    # interleaved, so that every client thread carries a mix of kinds
    jobs = jobs[::2] + jobs[1::2]
    with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
        futures = [pool.submit(attempt, tally, kind, expect, call) for kind, expect, call in jobs]
        for k in range(args.kills):
            killed_client(tally, target, scratch, base + 6000 + k)
        for f in futures:
            f.result()


def mad(xs: list[float]) -> float:
    m = statistics.median(xs)
    return statistics.median([abs(x - m) for x in xs])


def trend(samples: list[dict], metric: str, k: float, unit: float) -> dict:
    """The metric's start, warm (first sample of the second half), end, first/last-quarter
    medians, and over the second half: the least-squares slope against requests, the growth it
    projects over that half, the threshold (k x 1.4826 x MAD of the residuals, at least ``unit``)
    and the verdict: growth beyond that threshold, or a climb still rising (a slope k standard
    errors above 0, more than ``unit`` over the half, and quarter medians rising to the end)."""
    ys = [s[metric] for s in samples]
    n = len(samples)
    # the medians of each quarter of the samples after the start: a plateau shows as Q3 ~ Q4
    after = ys[1:] or ys
    quarters = [statistics.median(after[len(after) * i // 4:max(len(after) * (i + 1) // 4, len(after) * i // 4 + 1)])
                for i in range(4)]
    out = {"start": ys[0], "warm": ys[n // 2], "end": ys[-1], "max": max(ys), "quarter_medians": quarters,
           "q1_median": quarters[0], "q4_median": quarters[3]}
    half = samples[n // 2:]
    if len(half) < 4:
        return {**out, "verdict": "too few samples"}
    xs = [s["requests"] for s in half]
    ys = [s[metric] for s in half]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    residuals = [y - (my + slope * (x - mx)) for x, y in zip(xs, ys)]
    noise = 1.4826 * mad(residuals)
    growth = slope * (xs[-1] - xs[0])
    threshold = max(k * noise, unit)
    # A slow climb stays under the threshold over one half yet does not stop: its slope is still
    # k standard errors above 0 and the last quarters still rise (a plateau's do not).
    spread = math.sqrt(sum(r * r for r in residuals) / (len(half) - 2) / sxx) if sxx else 0.0
    t_stat = slope / spread if spread else (math.inf if slope > 0 else 0.0)
    rising = growth > unit and t_stat > k and quarters[1] < quarters[2] < quarters[3]
    verdict = "growth beyond noise" if growth > threshold else "still rising" if rising else "no growth beyond noise"
    return {**out, "slope_per_1k_requests": slope * 1000, "growth_over_half": growth, "noise_sd": noise,
            "threshold": threshold, "requests_in_half": xs[-1] - xs[0], "slope_t": t_stat, "verdict": verdict}


def cpu_model() -> str:
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    m = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    avx512 = "avx512f" in text
    return f"{m.group(1).strip() if m else 'unknown'}{' (avx512)' if avx512 else ''}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seq", type=int, default=8, help="sequential tiny inits per round")
    ap.add_argument("--clients", type=int, default=4, help="client threads at once (each request on a connection of its own)")
    ap.add_argument("--kills", type=int, default=1, help="client processes SIGKILLed mid-stream per round")
    ap.add_argument("--huge-every", type=int, default=5, help=f"plan {HUGE_PLAN} every N rounds (0: never)")
    ap.add_argument("--settle", type=float, default=1.0, help="seconds after a round before the sample")
    ap.add_argument("--k", type=float, default=3.0, help="growth threshold in robust standard deviations")
    ap.add_argument("--dir", default=None, help="scratch folder (default: the system temp dir)")
    ap.add_argument("--json", default="", help="write the samples, outcomes and trend here")
    args = ap.parse_args()
    if args.rounds < 1 or args.clients < 1:
        ap.error("--rounds and --clients must be >= 1")

    scratch = pathlib.Path(tempfile.mkdtemp(prefix="modelinit-soak-", dir=args.dir))
    started = time.perf_counter()
    server = Server(scratch / "server.log")
    tally = Tally()
    samples = [{"round": 0, "requests": 0, "wall_s": 0.0, **server.sample()}]
    cpu = cpu_model()
    print(f"machine: {os.cpu_count()} cores, {cpu}; server pid {server.proc.pid} at {server.target}; scratch {scratch}")
    header = f"{'round':>5} {'requests':>8} {'RSS MiB':>8} {'anon MiB':>8} {'fds':>4} {'threads':>7} {'cpu s':>7} {'ok':>6} {'refused':>7} {'unexp':>5} {'wall s':>7}"
    print(header)

    def show(s: dict, c: dict) -> None:
        print(f"{s['round']:>5} {s['requests']:>8} {s['rss_mib']:>8.1f} {s['anon_mib']:>8.1f} {s['fds']:>4} {s['threads']:>7} "
              f"{s['cpu_s']:>7.1f} {c['ok']:>6} {c['refused_or_cut']:>7} {c['unexpected']:>5} {s['wall_s']:>7.1f}", flush=True)

    show(samples[0], tally.counts())
    died = False
    for r in range(1, args.rounds + 1):
        one_round(r, args, server.target, scratch, tally)
        time.sleep(args.settle)
        if not server.alive():
            died = True
            print(f"the server died in round {r} (exit {server.proc.returncode}):\n{server.log_tail()}")
            break
        c = tally.counts()
        samples.append({"round": r, "requests": c["requests"], "wall_s": time.perf_counter() - started, **server.sample()})
        show(samples[-1], c)
    exit_code = server.stop()
    wall = time.perf_counter() - started

    units = {"rss_mib": PAGE / 2**20, "anon_mib": PAGE / 2**20, "fds": 1, "threads": 1}
    trends = {m: trend(samples, m, args.k, u) for m, u in units.items()}
    grew = [m for m, t in trends.items() if t["verdict"] in ("growth beyond noise", "still rising")]
    if any(t["verdict"] == "too few samples" for t in trends.values()):
        verdict = "too few samples for a trend (8 rounds or more)"
    else:
        verdict = "no growth beyond noise" if not grew else "growth beyond noise in " + ", ".join(
            f"{m} ({trends[m]['verdict']})" for m in grew)
    counts = tally.counts()
    refused: dict[str, int] = {}
    for _, got, exp in tally.records:
        if exp and got != "ok":
            refused[got] = refused.get(got, 0) + 1

    print(f"\n{counts['requests']} requests in {len(samples) - 1} rounds, {wall:.0f} s: {counts['ok']} ok, "
          f"{counts['refused_or_cut']} refused or cut as intended ({', '.join(f'{k} {v}' for k, v in sorted(refused.items()))}), "
          f"{counts['unexpected']} unexpected")
    for kind, got in tally.by_kind().items():
        print(f"  {kind:<26} {', '.join(f'{k} {v}' for k, v in got.items())}")
    for line in tally.unexpected[:20]:
        print(f"  UNEXPECTED {line}")
    print(f"\ntrend over the second half (after warm-up), against requests; threshold = max({args.k:g} x 1.4826 x MAD of the "
          "residuals, one unit)")
    print(f"{'metric':<9} {'start':>7} {'warm':>7} {'end':>7} {'Q1 med':>7} {'Q2 med':>7} {'Q3 med':>7} {'Q4 med':>7} "
          f"{'slope/1k':>9} {'growth':>8} {'threshold':>9}  verdict")
    for m, t in trends.items():
        if "slope_per_1k_requests" in t:
            quarters = " ".join(f"{q:>7.1f}" for q in t["quarter_medians"])
            print(f"{m:<9} {t['start']:>7.1f} {t['warm']:>7.1f} {t['end']:>7.1f} {quarters} "
                  f"{t['slope_per_1k_requests']:>9.3f} {t['growth_over_half']:>8.3f} {t['threshold']:>9.3f}  {t['verdict']}")
        else:
            print(f"{m:<9} {t['start']:>7.1f} {t['warm']:>7.1f} {t['end']:>7.1f}  {t['verdict']}")
    print(f"verdict: {verdict}; server exit status on SIGTERM: {exit_code}")

    failed = counts["unexpected"] > 0 or died or exit_code != 0
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({
            "command": sys.argv, "machine": {"cores": os.cpu_count(), "cpu": cpu}, "rounds": len(samples) - 1,
            "wall_s": wall, "counts": counts, "refused_by_code": refused, "outcomes": tally.by_kind(),
            "unexpected": tally.unexpected, "server": {"died": died, "exit_code": exit_code}, "samples": samples,
            "trend": trends, "k": args.k, "verdict": verdict, "failed": failed}, indent=1))
    if not failed:
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        print(f"server log: {scratch / 'server.log'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
