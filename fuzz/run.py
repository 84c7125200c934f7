"""The fuzzing campaign: atheris (libFuzzer for Python, coverage-guided) over the targets of
``fuzz.targets``, modelinit's own packages instrumented for coverage.

    python -m fuzz.run TARGET [--runs N] [--seconds S]      # one target, in this process
    python -m fuzz.run --all [--runs N] [--seconds S] [--json FILE]   # each in a process of its own, then a table

Each target starts from its seed corpus (fuzz/corpus/TARGET, read only) and keeps what it finds new
in a work folder (``--work``, default ~/.cache/modelinit-fuzz/TARGET), so a later campaign goes on
from there. An input that breaks the contract (an exception), runs past ``--timeout`` seconds or
takes more than ``--rss-mb`` of memory is written to ``--findings`` (default fuzz/findings, git-ignored)
as crash-*, timeout-* or oom-*; reproduce one with ``python -m fuzz.run TARGET FILE``. A fixed finding's
input goes into the target's corpus, as ``regression-NAME``, where the tests replay it.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
#: What atheris instruments: modelinit's packages (not torch, transformers or protobuf).
PACKAGES = ["modelinit", "modelinit_wire", "modelinit_server", "modelinit_host"]
#: Not instrumented: the engine's kernels, which numba compiles from their bytecode (atheris' probes in it
#: are no numba code), and whose coverage is the golden vectors' business, not the inputs'.
NOT_INSTRUMENTED = [f"modelinit_server.engine.{m.stem}" for m in (HERE.parent / "server/modelinit_server/engine").glob("*.py")
                    if m.stem != "__init__"]
#: libFuzzer's final lines: executions, speed, memory; and its coverage lines.
_STAT = re.compile(r"^stat::(\w+):\s+(\d+)", re.M)
_COV = re.compile(r"cov: (\d+) ft: (\d+) corp: (\d+)")


def _fuzz_one(args: argparse.Namespace) -> None:
    import atheris

    with atheris.instrument_imports(include=PACKAGES, exclude=NOT_INSTRUMENTED):
        from fuzz.targets import TARGETS

        target = TARGETS[args.target]
        target.setup()
    work = pathlib.Path(args.work or pathlib.Path.home() / ".cache" / "modelinit-fuzz" / target.name)
    findings = pathlib.Path(args.findings)
    work.mkdir(parents=True, exist_ok=True)
    findings.mkdir(parents=True, exist_ok=True)
    flags = [f"-max_len={target.max_len}", f"-timeout={args.timeout}", f"-rss_limit_mb={args.rss_mb}",
             f"-artifact_prefix={findings}/{target.name}-", "-print_final_stats=1"]
    if args.runs:
        flags.append(f"-runs={args.runs}")
    if args.seconds:
        flags.append(f"-max_total_time={args.seconds}")
    inputs = args.inputs or [str(work), str(CORPUS / target.name)]
    atheris.Setup([sys.argv[0], *flags, *inputs], target.one)
    atheris.Fuzz()


def _campaign(args: argparse.Namespace) -> int:
    """Every target in a child process; a table of what each ran and found."""
    from fuzz.targets import TARGETS

    rows = []
    for name in args.targets.split(",") if args.targets else TARGETS:
        findings = pathlib.Path(args.findings)
        before = set(findings.glob(f"{name}-*")) if findings.exists() else set()
        cmd = [sys.executable, "-m", "fuzz.run", name, f"--timeout={args.timeout}", f"--rss-mb={args.rss_mb}",
               f"--findings={args.findings}"] + ([f"--runs={args.runs}"] if args.runs else []) \
            + ([f"--seconds={args.seconds}"] if args.seconds else [])
        started = time.monotonic()
        done = subprocess.run(cmd, cwd=HERE.parent, capture_output=True, text=True)
        log = done.stdout + done.stderr
        stats = {k: int(v) for k, v in _STAT.findall(log)}
        cov = _COV.findall(log)
        found = sorted(p.name for p in (set(findings.glob(f"{name}-*")) if findings.exists() else set()) - before)
        rows.append({"target": name, "executions": stats.get("number_of_executed_units", 0),
                     "exec_per_s": stats.get("average_exec_per_sec", 0), "seconds": round(time.monotonic() - started),
                     "coverage": int(cov[-1][0]) if cov else 0, "features": int(cov[-1][1]) if cov else 0,
                     "corpus": int(cov[-1][2]) if cov else 0, "peak_rss_mb": stats.get("peak_rss_mb", 0),
                     "exit": done.returncode, "findings": found})
        print(f"{name:20s} {rows[-1]['executions']:>10,} runs {rows[-1]['exec_per_s']:>6}/s  cov {rows[-1]['coverage']:>5} "
              f"ft {rows[-1]['features']:>6}  corpus {rows[-1]['corpus']:>5}  rss {rows[-1]['peak_rss_mb']:>5} MB  "
              f"exit {done.returncode}  findings {len(found)}", flush=True)
        if done.returncode and not found:
            print(log[-3000:], file=sys.stderr)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    return 1 if any(r["findings"] or r["exit"] for r in rows) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("target", nargs="?", help="a target of fuzz.targets (see --list)")
    parser.add_argument("inputs", nargs="*", help="files to run once instead of fuzzing (a finding, to reproduce it)")
    parser.add_argument("--all", action="store_true", help="every target, each in a process of its own")
    parser.add_argument("--list", action="store_true", help="the targets and their contracts")
    parser.add_argument("--runs", type=int, default=0, help="stop after this many executions (0: no limit)")
    parser.add_argument("--seconds", type=int, default=0, help="stop after this long (0: no limit)")
    parser.add_argument("--timeout", type=int, default=10, help="seconds one input may take (a hang is a finding)")
    parser.add_argument("--rss-mb", type=int, default=4096, help="memory the process may reach (more is a finding)")
    parser.add_argument("--work", default="", help="where new corpus inputs are kept (default ~/.cache/modelinit-fuzz/TARGET)")
    parser.add_argument("--findings", default=str(HERE / "findings"), help="where inputs that break a contract go")
    parser.add_argument("--json", default="", help="with --all: write the table here")
    parser.add_argument("--targets", default="", help="with --all: only these (comma-separated)")
    args = parser.parse_args(argv)
    if args.list:
        from fuzz.targets import TARGETS

        for t in TARGETS.values():
            print(f"{t.name:20s} {t.contract}")
        return 0
    if args.all:
        return _campaign(args)
    if not args.target:
        parser.error("give a TARGET, --all or --list")
    os.environ.setdefault("MODELINIT_LOG_LEVEL", "error")
    _fuzz_one(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
