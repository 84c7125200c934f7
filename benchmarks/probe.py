"""The probe's time and peak memory: bert-base, tinyllama-1.1b and a 70B spec (as a proxy).

    python benchmarks/probe.py                          # the three, hf-default, 4 x 128 tokens
    python benchmarks/probe.py --models bert-base-uncased --repeat 3 --json /tmp/probe.json

Each case is ``modelinit probe MODEL --json FILE`` in a child process of this script (same process
group), timed from start to exit, start-up included; peak RSS and CPU seconds come from
``os.wait4`` (exact). The JSON it writes is read back and checked (one result, the layers the
model has, finite loss). Whether a proxy was used, and which, is printed beside each row: a model
that does not fit half the available memory is probed as a depth-preserving proxy (docs/probe.md).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

MODELS = ("bert-base-uncased", "tinyllama-1.1b", "llama-3-70b")


def run(model: str, args: argparse.Namespace, out: str) -> tuple[float, int, float]:
    cmd = [sys.executable, "-m", "modelinit.cli", "probe", model, "--seed", "0", "--batch", str(args.batch),
           "--seq", str(args.seq), "--json", out]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{model}: modelinit probe failed: {err.strip()}")
    return wall, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", default="", help="write the rows here")
    args = parser.parse_args()
    rows = []
    print(f"{'model':20s} {'wall s':>8s} {'peak RSS GB':>12s} {'CPU s':>8s} {'probed params':>14s}  proxy")
    for model in args.models.split(","):
        walls, rss, cpu = [], 0, []
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "probe.json")
            for _ in range(args.repeat):
                w, r, c = run(model, args, out)
                walls.append(w)
                rss = max(rss, r)
                cpu.append(c)
            result = json.load(open(out, encoding="utf-8"))["probe"]
        if len(result) != 1 or not result[0]["measures"]["layers"] or result[0]["measures"]["loss"] != result[0]["measures"]["loss"]:
            raise SystemExit(f"{model}: the probe's JSON is not one finite result")
        r0 = result[0]
        row = dict(model=model, wall_s=statistics.median(walls), peak_rss_bytes=rss, cpu_s=statistics.median(cpu),
                   probed_params=r0["params"], proxy=r0["proxy"], layers=len(r0["measures"]["layers"]))
        rows.append(row)
        proxy = r0["proxy"].split(";")[0] if r0["proxy"] else "whole model"
        print(f"{model:20s} {row['wall_s']:8.1f} {rss / 1e9:12.2f} {row['cpu_s']:8.1f} {r0['params']:14,}  {proxy}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
