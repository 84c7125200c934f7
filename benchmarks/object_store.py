"""Writing a model into object storage (S3) against writing it to local disk and against the
store library's own upload of the same bytes, in one run, on a moto S3 server on loopback.

    python benchmarks/object_store.py                                   # tinyllama-1.1b bf16, parts 1,2,4
    python benchmarks/object_store.py --model gpt2 --repeat 3 --json /tmp/object_store.json
    python benchmarks/object_store.py --timeline --parts 1              # where the S3 run's time goes

Everything runs as a child process of this script (same process group), one case at a time:

* the S3 server: moto's ``ThreadedMotoServer`` in its own process (``_moto``, 127.0.0.1, a free
  port), so that its CPU never shares a GIL with the client measured; its CPU seconds (utime +
  stime from /proc) are taken around every case. Objects stay in its memory
  (``MOTO_S3_DEFAULT_KEY_BUFFER_SIZE``; ``--moto-spill-to-disk`` for moto's default, which sends
  every part and object over 5 MiB through temporary files: slower and much noisier);
* ``local``: ``modelinit init MODEL --dtype D --seed 0 --quiet --out DIR`` (embedded engine, a
  folder on local disk);
* ``s3``: the same with ``--out s3://BUCKET/PREFIX`` (``AWS_ENDPOINT_URL``, ``AWS_ALLOW_HTTP=true``);
* ``ceiling path`` / ``ceiling iter``: the library's own upload of the ``local`` folder's files to
  the same server, in a fresh process (``_put``): ``obstore.put`` of each file, one after the
  other, a shard as one multipart upload with modelinit's ``PART_BYTES`` and ``PARTS_IN_FLIGHT``,
  on the store modelinit opens (``modelinit.bucket.Bucket(url).store``: same retry and checksum
  settings), the file in the page cache; ``path``: obstore reads the file itself, ``iter``: from a
  Python iterator of 8 MiB ``bytes`` (the embedded engine's segment size), as modelinit feeds it.
  The headline divides by the faster of the two;
* scaling: N processes ``--part K/N`` started at once (N in ``--parts``), into one local folder
  (through obstore's local store, as ``--part`` does) and into one S3 prefix; the model is split
  into shards of ``--scale-max-shard-size`` so that there are shards to share. The wall time is
  until the last process exits; "vs" is the speedup over N=1.

Every output is checked before it counts: ``modelinit.json`` is there, its files (name, size,
SHA-256) equal the reference run's, no stray or hidden ``.modelinit.*`` object is left, no
multipart upload is left open; on S3 the listing (names and sizes) equals the local folder's.

Peak RSS and CPU seconds (user + system) of each client process come from ``os.wait4`` (exact,
not sampled); "peak RSS" is the largest one process reached. Throughput is the model's bytes
(every file) over the whole process's wall time, start-up included, for the ceiling too. The
headline is ``s3 / ceiling`` = ceiling wall / s3 wall (medians over ``--repeat``); the issue's
target is >= 70%.

How to read it. moto is a Python server: on a small machine it, not the client, sets the pace,
and client and server share the cores (read the moto CPU column). Two things weigh on the ratio:
the upload timeline (``ceiling iter`` always, modelinit's S3 runs with ``--timeline``) splits each
process into start-up, streaming (the "producer" share: the iterator making chunks; the "obstore"
share: the iterator held back while parts are in flight, i.e. the server is the limit) and
drain+complete (after the last chunk: the last parts in flight, then CompleteMultipartUpload,
which moto does in Python, concatenating and re-hashing the whole object: seconds per GB, a cost
real stores do not have, and one that both sides pay, so it pulls the ratio towards 100%).

Not a test: it prints tables (and ``--json PATH`` writes the figures and every run).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
PY = sys.executable
REGION = "us-east-1"
KEYS = {"AWS_ACCESS_KEY_ID": "modelinit-bench", "AWS_SECRET_ACCESS_KEY": "modelinit-bench-secret"}
TICK = os.sysconf("SC_CLK_TCK")
ITER_CHUNK = 8 << 20
"""``ceiling-iter``'s chunk: the embedded engine's segment (modelinit_server.produce.file_bytes.SEGMENT)."""


# -- children ---------------------------------------------------------------------------------------
T0 = time.perf_counter()


def trace_puts() -> None:
    """Where ``$MODELINIT_BENCH_TIMELINE`` names a file: wrap ``obstore.put`` so that each
    multipart upload records, in seconds since this process started, when it was called, when it
    took its first and last chunk from the iterator and when it returned, how long the iterator
    spent producing chunks (``producer``) and how long obstore kept it waiting between them
    (``held``: back-pressure, parts in flight); the records go to the file at exit. Observation
    only: the chunks pass unchanged."""
    path = os.environ.get("MODELINIT_BENCH_TIMELINE")
    if not path:
        return
    import atexit

    import obstore

    put, records = obstore.put, []

    def now() -> float:
        return time.perf_counter() - T0

    def traced(store, name, data, **kw):
        if not kw.get("use_multipart") or isinstance(data, (bytes, bytearray, memoryview, pathlib.Path)):
            return put(store, name, data, **kw)
        rec = {"name": name, "bytes": 0, "called": now(), "first": None, "last": None, "producer": 0.0, "held": 0.0}

        def chunks(it):
            it = iter(it)
            while True:
                t = time.perf_counter()
                try:
                    chunk = next(it)
                except StopIteration:
                    break
                u = time.perf_counter()
                rec["producer"] += u - t
                rec["first"] = rec["first"] if rec["first"] is not None else now()
                rec["bytes"] += memoryview(chunk).nbytes
                yield chunk
                rec["held"] += time.perf_counter() - u
            rec["last"] = now()

        try:
            return put(store, name, chunks(data), **kw)
        finally:
            rec["returned"] = now()
            records.append(rec)

    obstore.put = traced
    atexit.register(lambda: pathlib.Path(path).write_text(json.dumps(records)))


def child_cli(argv: list[str]) -> int:
    """``modelinit ARGV`` with :func:`trace_puts` (the module looks obstore.put up at each call)."""
    trace_puts()
    from modelinit.cli import main as cli

    return cli(argv)


def child_moto() -> None:
    """The S3 server: prints ``host:port``, serves until stdin closes."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    print(f"{host}:{port}", flush=True)
    sys.stdin.read()
    server.stop()


def child_put(src: str, url: str, mode: str) -> None:
    """The ceiling: upload every file of the folder ``src`` under ``url`` as modelinit would
    (shards as one multipart upload each, one at a time; modelinit.json last). ``mode``: ``path``
    (obstore reads the file) or ``iter`` (a Python iterator of ITER_CHUNK ``bytes``)."""
    trace_puts()
    import obstore  # after trace_puts: its put, traced
    from modelinit.bucket import PART_BYTES, PARTS_IN_FLIGHT, Bucket

    store = Bucket(url).store
    files = sorted((p for p in pathlib.Path(src).iterdir() if not p.name.startswith(".")),
                   key=lambda p: (p.name == "modelinit.json", -p.stat().st_size, p.name))

    def chunks(path: pathlib.Path):
        with open(path, "rb", buffering=0) as f:
            while block := f.read(ITER_CHUNK):
                yield block

    for path in files:
        if path.stat().st_size < PART_BYTES:
            obstore.put(store, path.name, path.read_bytes(), use_multipart=False)
        else:
            obstore.put(store, path.name, chunks(path) if mode == "iter" else path, use_multipart=True,
                        chunk_size=PART_BYTES, max_concurrency=PARTS_IN_FLIGHT)


# -- measuring --------------------------------------------------------------------------------------
class Moto:
    """The moto server process; :meth:`cpu` is its CPU seconds so far (all threads)."""

    def __init__(self, work: pathlib.Path, in_memory: bool) -> None:
        self.log = open(work / "moto.log", "w")
        # moto keeps an object in memory up to this size and spills the rest to a temporary file
        # (default: 5 MiB, so every part and every object goes through the disk).
        env = {**os.environ, "MOTO_S3_DEFAULT_KEY_BUFFER_SIZE": str(64 << 30)} if in_memory else None
        self.proc = subprocess.Popen([PY, __file__, "_moto"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, env=env)
        line = self.proc.stdout.readline().strip()
        if not line:
            sys.exit(f"the moto server did not start: {(work / 'moto.log').read_text()[-2000:]}")
        self.endpoint = f"http://{line}"

    def cpu(self) -> float:
        fields = pathlib.Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime

    def peak_rss(self) -> int:
        for line in pathlib.Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return 0

    def env(self) -> dict[str, str]:
        return {**os.environ, **KEYS, "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true"}

    def admin(self):
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id=KEYS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=KEYS["AWS_SECRET_ACCESS_KEY"],
                            config=Config(request_checksum_calculation="when_required",
                                          response_checksum_validation="when_required"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def run_at_once(cmds: list[list[str]], env: dict, logs: pathlib.Path, moto: Moto | None, traced: bool = False) -> dict:
    """Start every command at once; wait for all. Wall seconds until the last exits, and each
    process's peak RSS and CPU seconds (``os.wait4``, exact); the moto server's CPU seconds over
    the same span; with ``traced``, the (one) command's upload timeline (:func:`trace_puts`).
    Exits naming the command when one fails."""
    timeline = logs / "timeline.json"
    timeline.unlink(missing_ok=True)
    if traced:
        env = {**env, "MODELINIT_BENCH_TIMELINE": str(timeline)}
    os.sync()  # the previous case's dirty pages are not this one's to write
    cpu0 = moto.cpu() if moto else 0.0
    outs, procs = [], []
    t0 = time.perf_counter()
    try:
        for i, cmd in enumerate(cmds):
            out = open(logs / f"proc{i}.log", "w")
            outs.append(out)
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env))
        results = []
        for p in procs:
            _, status, usage = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            results.append({"rss": usage.ru_maxrss * 1024, "cpu": usage.ru_utime + usage.ru_stime,
                            "user": usage.ru_utime, "sys": usage.ru_stime, "rc": p.returncode})
        wall = time.perf_counter() - t0
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                p.wait()
        for out in outs:
            out.close()
    for i, (cmd, r) in enumerate(zip(cmds, results)):
        if r["rc"]:
            sys.exit(f"failed (exit {r['rc']}): {' '.join(cmd)}\n{(logs / f'proc{i}.log').read_text()[-3000:]}")
    out = {"wall": wall, "procs": results, "moto_cpu": (moto.cpu() - cpu0) if moto else None}
    if traced and timeline.exists():
        out["timeline"] = json.loads(timeline.read_text())
    return out


# -- checking outputs -------------------------------------------------------------------------------
def manifest_files(data: bytes) -> list[tuple[str, int, str]]:
    return [(f["name"], f["size"], f["sha256"]) for f in json.loads(data)["files"]]


def folder_sizes(folder: pathlib.Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in folder.iterdir()}


def check_folder(folder: pathlib.Path, reference: list | None) -> list[tuple[str, int, str]]:
    """A complete output folder: modelinit.json, every file it lists at its size, nothing else (no
    hidden records left); its files equal ``reference``'s (name, size, SHA-256) when given."""
    manifest = folder / "modelinit.json"
    if not manifest.is_file():
        sys.exit(f"check: {folder} has no modelinit.json")
    files = manifest_files(manifest.read_bytes())
    want = {name: size for name, size, _ in files} | {"modelinit.json": manifest.stat().st_size}
    if folder_sizes(folder) != want:
        sys.exit(f"check: {folder} holds {folder_sizes(folder)}, its manifest lists {want}")
    if reference is not None and files != reference:
        sys.exit(f"check: {folder}'s files differ from the reference run's:\n{files}\n{reference}")
    return files


def s3_objects(admin, bucket: str, prefix: str) -> dict[str, int]:
    out = {}
    for page in admin.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for o in page.get("Contents", []):
            out[o["Key"][len(prefix) + 1:]] = o["Size"]
    return out


def check_s3(admin, bucket: str, prefix: str, like: pathlib.Path, manifest: bool = True) -> None:
    """The prefix holds exactly the folder ``like``'s files (names, sizes), no open multipart
    upload; with ``manifest``, its modelinit.json lists the same files (name, size, SHA-256)."""
    got, want = s3_objects(admin, bucket, prefix), folder_sizes(like)
    if got != want:
        sys.exit(f"check: s3://{bucket}/{prefix} holds {got}, expected {want}")
    pending = [u["Key"] for u in admin.list_multipart_uploads(Bucket=bucket, Prefix=prefix + "/").get("Uploads", [])]
    if pending:
        sys.exit(f"check: s3://{bucket}/{prefix} has open multipart uploads: {pending}")
    if manifest:
        data = admin.get_object(Bucket=bucket, Key=f"{prefix}/modelinit.json")["Body"].read()
        if manifest_files(data) != manifest_files((like / "modelinit.json").read_bytes()):
            sys.exit(f"check: s3://{bucket}/{prefix}/modelinit.json lists other files than {like}/modelinit.json")


def drop_s3(admin, bucket: str, prefix: str) -> None:
    """Delete the prefix's objects (moto keeps them in memory)."""
    for name in s3_objects(admin, bucket, prefix):
        admin.delete_object(Bucket=bucket, Key=f"{prefix}/{name}")


def read_through(folder: pathlib.Path) -> None:
    """Read every file once, so that the ceiling reads from the page cache, not the disk
    (modelinit writes with O_DIRECT, bypassing it)."""
    for p in folder.iterdir():
        with open(p, "rb", buffering=0) as f:
            while f.read(64 << 20):
                pass


# -- report -----------------------------------------------------------------------------------------
def summary(name: str, runs: list[dict], nbytes: int) -> dict:
    wall = statistics.median(r["wall"] for r in runs)
    return {
        "case": name,
        "procs": len(runs[0]["procs"]),
        "wall_s": wall,
        "walls_s": [r["wall"] for r in runs],
        "gb_per_s": nbytes / wall / 1e9,
        "client_cpu_s": statistics.median(sum(p["cpu"] for p in r["procs"]) for r in runs),
        "client_user_s": statistics.median(sum(p["user"] for p in r["procs"]) for r in runs),
        "client_sys_s": statistics.median(sum(p["sys"] for p in r["procs"]) for r in runs),
        "peak_rss_bytes": max(p["rss"] for r in runs for p in r["procs"]),
        "moto_cpu_s": statistics.median(r["moto_cpu"] for r in runs) if runs[0]["moto_cpu"] is not None else None,
    }


def table(rows: list[dict], ref: dict[str, str]) -> str:
    """``ref``: case -> the case its "vs" column divides by (ref wall / this wall)."""
    by = {r["case"]: r for r in rows}
    head = f"{'case':<22}{'procs':>5}{'wall s':>9}{'GB/s':>8}{'vs':>24}{'client CPU s':>14}{'peak RSS GB':>13}{'moto CPU s':>12}"
    lines = [head, "-" * len(head)]
    for r in rows:
        vs = ""
        if r["case"] in ref and ref[r["case"]] in by:
            vs = f"{by[ref[r['case']]]['wall_s'] / r['wall_s']:.0%} {ref[r['case']]}"
        moto = "" if r["moto_cpu_s"] is None else f"{r['moto_cpu_s']:.1f}"
        lines.append(f"{r['case']:<22}{r['procs']:>5}{r['wall_s']:>9.2f}{r['gb_per_s']:>8.3f}{vs:>24}"
                     f"{r['client_cpu_s']:>14.1f}{r['peak_rss_bytes'] / 1e9:>13.2f}{moto:>12}")
    return "\n".join(lines)


def timeline_table(traced: list[tuple[str, list[dict]]]) -> str:
    """Per traced case: when the first upload began (start-up, plan, survey), the time spent
    streaming (first chunk asked for to last chunk taken, summed over the multipart uploads) split
    into the producer's share and obstore's (waiting on parts in flight), then the time from the
    last chunk to put's return (the parts still in flight, then CompleteMultipartUpload: the
    producer idles), and the wall time."""
    head = f"{'case':<22}{'start':>8}{'streaming':>11}{'producer':>10}{'obstore':>9}{'drain+complete':>16}{'wall':>8}"
    lines = [head, "-" * len(head)]
    for case, rs in traced:
        def med(f):
            return statistics.median(f([u for u in r["timeline"] if u["last"] is not None], r) for r in rs)
        start = med(lambda us, r: min((u["called"] for u in us), default=0.0))
        stream = med(lambda us, r: sum(u["last"] - u["called"] for u in us))
        prod = med(lambda us, r: sum(u["producer"] for u in us))
        held = med(lambda us, r: sum(u["held"] for u in us))
        tail = med(lambda us, r: sum(u["returned"] - u["last"] for u in us))
        wall = statistics.median(r["wall"] for r in rs)
        lines.append(f"{case:<22}{start:>8.2f}{stream:>11.2f}{prod:>10.2f}{held:>9.2f}{tail:>16.2f}{wall:>8.2f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tinyllama-1.1b", help="preset or config.json (default tinyllama-1.1b)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-shard-size", default=None, help="for local/s3/ceiling (default: modelinit's, 5GB)")
    ap.add_argument("--scale-max-shard-size", default="250MB", help="for the --part runs, so that there are shards to share")
    ap.add_argument("--parts", default="1,2,4", help="process counts of the scaling runs ('' for none)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each case (the median is reported)")
    ap.add_argument("--no-iter-ceiling", action="store_true", help="skip the iterator-fed ceiling")
    ap.add_argument("--timeline", action="store_true",
                    help="run modelinit's single-process S3 cases through a wrapper that times each upload (feed vs "
                         "drain+complete); off, they run the plain CLI")
    ap.add_argument("--moto-spill-to-disk", action="store_true",
                    help="moto's default: objects over 5 MiB go through temporary files (slower, noisier); by default "
                         "the benchmark keeps them in moto's memory")
    ap.add_argument("--json", default=None, metavar="PATH", help="also write the figures here")
    ap.add_argument("--dir", default=None, help="parent of the scratch folder (default /tmp)")
    args = ap.parse_args()
    parts = [int(n) for n in args.parts.split(",") if n.strip()]

    work = pathlib.Path(tempfile.mkdtemp(prefix="modelinit-objstore-", dir=args.dir or "/tmp"))
    logs = work / "logs"
    logs.mkdir()
    init = [PY, "-m", "modelinit.cli", "init", args.model, "--seed", "0", "--dtype", args.dtype, "--quiet"]
    single = init + (["--max-shard-size", args.max_shard_size] if args.max_shard_size else [])
    scaled = init + ["--max-shard-size", args.scale_max_shard_size]
    moto = None
    try:
        print(f"machine: {os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB; "
              f"python {platform.python_version()}; model {args.model} {args.dtype}; scratch {work}", flush=True)
        run_at_once([single + ["--out", str(work / "warm")]], dict(os.environ), logs, None)  # numba cache, page cache
        shutil.rmtree(work / "warm")
        moto = Moto(work, in_memory=not args.moto_spill_to_disk)
        admin = moto.admin()
        bucket = "modelinit-bench"
        admin.create_bucket(Bucket=bucket)
        env = moto.env()
        print(f"moto S3 server: {moto.endpoint} (pid {moto.proc.pid})", flush=True)

        runs: dict[str, list[dict]] = {}
        local = work / "local"
        reference = None
        nbytes = 0
        for rep in range(args.repeat):
            shutil.rmtree(local, ignore_errors=True)
            r = run_at_once([single + ["--out", str(local)]], env, logs, moto)
            reference = check_folder(local, reference)
            nbytes = sum(folder_sizes(local).values())
            runs.setdefault("local", []).append(r)
            print(f"  [{rep + 1}/{args.repeat}] local        {r['wall']:7.2f} s", flush=True)

            prefix = f"single-{rep}"
            cli = [PY, __file__, "_cli", *single[3:]] if args.timeline else single
            r = run_at_once([cli + ["--out", f"s3://{bucket}/{prefix}"]], env, logs, moto, traced=args.timeline)
            check_s3(admin, bucket, prefix, local)
            drop_s3(admin, bucket, prefix)
            runs.setdefault("s3", []).append(r)
            print(f"  [{rep + 1}/{args.repeat}] s3           {r['wall']:7.2f} s", flush=True)

            for mode in ("path", *([] if args.no_iter_ceiling else ["iter"])):
                case = f"ceiling {mode}"
                read_through(local)
                prefix = f"ceiling-{mode}-{rep}"
                r = run_at_once([[PY, __file__, "_put", str(local), f"s3://{bucket}/{prefix}", mode]], env, logs, moto,
                                traced=mode == "iter")
                check_s3(admin, bucket, prefix, local)
                drop_s3(admin, bucket, prefix)
                runs.setdefault(case, []).append(r)
                print(f"  [{rep + 1}/{args.repeat}] {case:<12} {r['wall']:7.2f} s", flush=True)

        scale_ref = None
        scale_bytes = 0
        for n in parts:
            for rep in range(args.repeat):
                folder = work / f"parts-{n}"
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
                share = [[] if n == 1 else ["--part", f"{k}/{n}"] for k in range(n)]
                r = run_at_once([scaled + s + ["--out", str(folder)] for s in share], env, logs, moto)
                scale_ref = check_folder(folder, scale_ref)
                scale_bytes = sum(folder_sizes(folder).values())
                runs.setdefault(f"local parts={n}", []).append(r)
                print(f"  [{rep + 1}/{args.repeat}] local x{n}     {r['wall']:7.2f} s", flush=True)

                prefix = f"parts-{n}-{rep}"
                traced = args.timeline and n == 1
                cli = [PY, __file__, "_cli", *scaled[3:]] if traced else scaled
                r = run_at_once([cli + s + ["--out", f"s3://{bucket}/{prefix}"] for s in share], env, logs, moto, traced=traced)
                check_s3(admin, bucket, prefix, folder)
                drop_s3(admin, bucket, prefix)
                runs.setdefault(f"s3 parts={n}", []).append(r)
                print(f"  [{rep + 1}/{args.repeat}] s3 x{n}        {r['wall']:7.2f} s", flush=True)
                if n != parts[0]:
                    shutil.rmtree(folder)
        shards = len([f for f in (scale_ref or []) if f[0].endswith(".safetensors")])

        rows = [summary(c, runs[c], nbytes) for c in ("local", "s3", "ceiling path", "ceiling iter") if c in runs]
        scale_rows = [summary(c, rs, scale_bytes) for c, rs in runs.items() if "parts=" in c]
        by = {r["case"]: r for r in rows}
        best = min((c for c in ("ceiling path", "ceiling iter") if c in by), key=lambda c: by[c]["wall_s"])
        vs = {"s3": best}
        first = parts[0] if parts else None
        vs |= {f"{kind} parts={n}": f"{kind} parts={first}" for kind in ("local", "s3") for n in parts if n != first}
        print()
        print(f"{args.model} {args.dtype}: {nbytes / 1e9:.3f} GB in {len(reference or [])} files; "
              f"median of {args.repeat} run(s); moto peak RSS {moto.peak_rss() / 1e9:.2f} GB")
        print(table(rows, vs))
        ratios = {c: by[c]["wall_s"] / by["s3"]["wall_s"] for c in ("ceiling path", "ceiling iter") if c in by}
        ratio = ratios[best]
        print(f"  -> modelinit to S3 / the library's own upload: {ratio:.0%} of the faster ceiling ({best}); "
              + ", ".join(f"{v:.0%} of {c}" for c, v in ratios.items())
              + f" (target >= 70%: {'met' if ratio >= 0.7 else 'NOT met'})")
        traced = [(c, rs) for c, rs in runs.items() if all("timeline" in r for r in rs)]
        if traced:
            print()
            print("upload timeline (medians; seconds since the process started; sums over its multipart uploads):")
            print(timeline_table(traced))
        if scale_rows:
            print()
            print(f"scaling: {len(parts)} process counts, --part K/N started at once, shards of {args.scale_max_shard_size} "
                  f"({shards} shards, {scale_bytes / 1e9:.3f} GB); 'vs' = speedup over N={first}")
            print(table(scale_rows, vs))
        if args.json:
            doc = {"machine": {"cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
                   "args": vars(args), "bytes": nbytes, "files": [list(f) for f in reference or []],
                   "scale_bytes": scale_bytes, "scale_shards": shards, "s3_vs_ceiling": ratio, "ceiling": best,
                   "s3_vs_each_ceiling": ratios,
                   "moto_peak_rss_bytes": moto.peak_rss(), "rows": rows + scale_rows, "runs": runs}
            pathlib.Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
            print(f"wrote {args.json}")
    finally:
        if moto is not None:
            moto.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_moto":
        child_moto()
    elif len(sys.argv) > 1 and sys.argv[1] == "_put":
        child_put(*sys.argv[2:5])
    elif len(sys.argv) > 1 and sys.argv[1] == "_cli":
        sys.exit(child_cli(sys.argv[2:]))
    else:
        main()
