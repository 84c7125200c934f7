"""The probe's time and peak memory: bert-base, tinyllama-1.1b and a 70B spec (as a proxy).

    python benchmarks/probe.py                          # the three, hf-default, 4 x 128 tokens
    python benchmarks/probe.py --models bert-base-uncased --repeat 3 --json /tmp/probe.json
    python benchmarks/probe.py --widths 128,256,512,1024 --steps 3   # the coordinate check of a small Llama

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
#: The coordinate check's model: head size 64, 4 layers, 2:1 GQA, Llama's
#: 2.75x feed-forward, an 8192-token vocabulary; given at width 256 and rebuilt at each --widths.
SMALL_LLAMA = {"model_type": "llama", "vocab_size": 8192, "hidden_size": 256, "num_hidden_layers": 4,
               "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 704,
               "max_position_embeddings": 2048, "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": False}


def run(model: str, args: argparse.Namespace, out: str) -> tuple[float, int, float]:
    cmd = [sys.executable, "-m", "modelinit.cli", "probe", model, "--seed", "0", "--batch", str(args.batch),
           "--seq", str(args.seq), "--json", out]
    if args.widths:
        cmd += ["--widths", args.widths, "--steps", str(args.steps)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{model}: modelinit probe failed: {err.strip()}")
    return wall, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def repeated(model: str, args: argparse.Namespace, out: str) -> tuple[float, int, float]:
    """``run`` ``--repeat`` times: the median wall, the largest peak RSS, the median CPU seconds."""
    runs = [run(model, args, out) for _ in range(args.repeat)]
    return (statistics.median(r[0] for r in runs), max(r[1] for r in runs), statistics.median(r[2] for r in runs))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", default="", help="write the rows here")
    parser.add_argument("--widths", default="", help="the coordinate check at these widths (default model: a small Llama)")
    parser.add_argument("--steps", type=int, default=3, help="with --widths: optimizer steps (default 3)")
    args = parser.parse_args()
    if args.widths:
        return coord(args)
    rows = []
    print(f"{'model':20s} {'wall s':>8s} {'peak RSS GB':>12s} {'CPU s':>8s} {'probed params':>14s}  proxy")
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "probe.json")
            wall, rss, cpu = repeated(model, args, out)
            result = json.load(open(out, encoding="utf-8"))["probe"]
        if len(result) != 1 or not result[0]["measures"]["layers"] or result[0]["measures"]["loss"] != result[0]["measures"]["loss"]:
            raise SystemExit(f"{model}: the probe's JSON is not one finite result")
        r0 = result[0]
        row = dict(model=model, wall_s=wall, peak_rss_bytes=rss, cpu_s=cpu,
                   probed_params=r0["params"], proxy=r0["proxy"], layers=len(r0["measures"]["layers"]))
        rows.append(row)
        proxy = r0["proxy"].split(";")[0] if r0["proxy"] else "whole model"
        print(f"{model:20s} {row['wall_s']:8.1f} {rss / 1e9:12.2f} {row['cpu_s']:8.1f} {r0['params']:14,}  {proxy}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)
    return 0


def coord(args: argparse.Namespace) -> int:
    """The coordinate check's time and peak memory, one row per model."""
    rows = []
    print(f"{'model':20s} {'widths':>20s} {'steps':>5s} {'wall s':>8s} {'peak RSS GB':>12s} {'CPU s':>8s}  first problem")
    with tempfile.TemporaryDirectory() as tmp:
        models = args.models.split(",") if args.models != ",".join(MODELS) else [os.path.join(tmp, "small-llama.json")]
        if models == [os.path.join(tmp, "small-llama.json")]:
            with open(models[0], "w", encoding="utf-8") as fh:
                json.dump(SMALL_LLAMA, fh)
        for model in models:
            out = os.path.join(tmp, "coord.json")
            wall, rss, cpu = repeated(model, args, out)
            result = json.load(open(out, encoding="utf-8"))["coord_check"]
            widths = [int(x) for x in args.widths.split(",")]
            if len(result) != 1 or result[0]["widths"] != sorted(set(widths)) or \
                    not all(v == v and abs(v) != float("inf") for step in result[0]["losses"] for v in step):
                raise SystemExit(f"{model}: the coordinate check's JSON is not one finite result at the widths asked")
            name = "small-llama" if model.endswith("small-llama.json") else model
            row = dict(model=name, widths=result[0]["widths"], steps=args.steps, wall_s=wall,
                       peak_rss_bytes=rss, cpu_s=cpu, params=result[0]["params"],
                       first_problem=result[0]["first_problem"])
            rows.append(row)
            print(f"{name:20s} {args.widths:>20s} {args.steps:5d} {row['wall_s']:8.1f} {rss / 1e9:12.2f} {row['cpu_s']:8.1f}  "
                  f"{row['first_problem'] or 'stable'}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
