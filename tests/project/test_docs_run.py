"""Every command and program of the docs runs as written, so a recipe cannot drift from the code.

Collected: every fenced block of README.md and docs/*.md whose language is ``python``, ``bash``,
``sh``, ``shell`` or ``console`` (tests/support/doc_blocks.py reads them). Each one is either run
here or excused, on the line(s) right above its fence, by a marker that says why;
:func:`test_every_block_is_run_or_excused` fails listing every block that is neither (a marker
this grammar does not read, a replacement whose text is no longer in the block, a block left with
nothing to run...), so a new block must run, or say why not.

How a block runs, in a fresh temp folder of its own (its working directory):

- ``python``: the block's text as a file, run as ``python block.py`` runs it.
- ``bash``, ``sh``, ``shell``: the text as a file, run by ``bash -euo pipefail block.sh``; a
  ``console`` block runs its ``$ `` lines. Exit 0 passes; anything else fails with its output.
- **Installs are not run**: of a line's ``&&``-joined commands, those that install (``pip install
  ...``, ``pip wheel ...``, ``python3 -m venv ...``, activating a venv: ``. .venv/bin/activate``)
  are left out, and a line of installs only is dropped, since the tests run in the installed test
  environment. A block left with nothing to run must be excused (``skip (installs only)``); an
  install the runner cannot take out (after ``;``, in a subshell) is refused.
- **Each Python process as from a fresh interpreter, forked from a preloaded one**: a python
  block, and a bash block's ``modelinit ...`` and ``python SCRIPT ...``, run in a process forked
  from this test process's server (tests/support/preforked.py), which imported torch and
  transformers once; what the program sees is what a fresh ``python SCRIPT`` gives it (argv, the
  working directory, environment, ``sys.path``, stdio, exit status and what an interpreter's exit
  does), and the project's own modules are imported afresh by each (only third-party modules are
  preloaded). Other forms (``python -c``, ``-m``) run the real interpreter.
- The environment is the tests' own (the server's shims, then the venv's ``bin``, first on PATH, so
  ``modelinit`` is the console script) without settings that would reach outside (``AWS_*``, ``AZURE_*``, ``GOOGLE_*``,
  ``RAY_ADDRESS``, ``MODELINIT_TOKEN``), plus what the marker's fixtures add.

The markers (HTML comments, invisible on the rendered page; several marker lines right above one
fence, other comments such as ``<!-- ci:test -->`` between them allowed, are read as one)::

    <!-- doc-test: skip (REASON) -->      not run; REASON says why, e.g. (needs a Kubernetes cluster)
    <!-- doc-test: synopsis -->           a synopsis (SPEC, DIR, [options] are placeholders): not run,
                                          but every `modelinit SUB` in it must be a command and every
                                          --flag on its line one that `modelinit SUB --help` lists
    <!-- doc-test: run; OPTION; ... -->   run, after the options below (no marker: run as it is)

    OPTION := OLD -> NEW          replace every OLD in the block's text by NEW before running it;
                                  OLD must occur. For what is too large or remote for a test: a
                                  preset -> a tiny config, a bucket -> a bucket of the test S3
                                  server, a host -> a test server
            | with FIXTURE        a fixture the block needs whose placeholder it does not use
            | before COMMAND      a bash command run first, in the same folder and environment:
                                  the state an earlier step of the page leaves (a checkpoint the
                                  block reads)
            | copy PATH           the repository's PATH copied into the folder (files the block
                                  names by a relative path; it may write there)
            | continues           run after the page's previous python block, in one interpreter
                                  (the two are one program, split by prose); that block then
                                  runs only there, at the head of this one's program
            | output              the run's stdout must end with the next fenced block's text
            | prints TEXT         the run's stdout must hold TEXT (a label of a report the block
                                  prints: a script renamed or moved under it fails here)
            | xfail REASON        the run must fail, for REASON (a code bug, reported): a strict
                                  xfail, so the fix turns it into a failure that asks to drop this

    Words are shell words: quote one that holds spaces or ';' ("..." or '...'); ';' outside
    quotes separates options.

    Placeholders, in NEW and COMMAND (each starts its fixture):
      {tiny:FAMILY}  the absolute path of a folder holding the config.json of tests.support.TINY[FAMILY]
      {server}       HOST:PORT of a real modelinit server in the test process (conftest's server_target)
      {bucket}       a new, empty bucket of the S3 server on loopback (tests/support/s3_server.py);
                     the block's environment points at that server (AWS_ENDPOINT_URL, keys)
      {cwd}          the block's folder, absolute
    FIXTURE (with):
      s3             the S3 server's environment, no bucket
      ray            RAY_ADDRESS of a local Ray cluster of 2 CPUs (tests/support/ray_cluster.py),
                     started with the S3 server's environment so its workers reach it
      dist           a one-process torch.distributed world, as `torchrun --nproc-per-node 1` sets it
                     (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK)
      torchtitan     torchtitan importable (installed by the tests into tests/.stacks, tests/support/stacks.py)

For example::

    <!-- doc-test: run; "init llama-3-8b" -> "init {tiny:llama}"; "my-bucket" -> "{bucket}" -->
    <!-- doc-test: skip (needs a Kubernetes cluster) -->

Cost: each block is a process or several. Forked from the preloaded server, a program no longer
pays the imports of torch and transformers (3-4 CPU-seconds each, about 25 programs): the module
took 138 CPU-seconds (84 s on 2 workers) instead of 215 (123 s) on the 2-core development machine
(2026-12-07), plus each worker's server start and the Ray cluster's (the ray blocks). The heaviest
is probe.md's Reproduce block (its five commands, two of them plots).

The README's quick start and its CI test command are excused (the one installs a venv, the other
is what CI runs itself: pytest inside pytest would loop); a run block that calls pytest is refused.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import REPO, TINY
from tests.support.doc_blocks import Block, all_blocks, blocks

pytestmark = pytest.mark.slow  # subprocesses, and a server that imports torch and transformers

LANGS = {"python", "bash", "sh", "shell", "console"}
#: How long one block (or one ``before`` command) may run: a guard against hanging, not a measure.
TIMEOUT = 600

_MARKER = re.compile(r"^<!-- doc-test:\s*(?P<body>.*?)\s*-->$")
_PLACEHOLDER = re.compile(r"\{(tiny:\w+|server|bucket|cwd)\}")
_BRACES = re.compile(r"(?<!\$)\{([\w:.-]+)\}")  # {name} in NEW or COMMAND (bash's ${VAR} is not one)
FIXTURES = {"s3", "ray", "dist", "torchtitan"}
_INSTALL = re.compile(r"^(?:pip3?\s+(?:install|wheel)|python3?\s+-m\s+(?:pip\s+(?:install|wheel)|venv)|(?:\.|source)\s+\S*bin/activate)(?:\s|$)")
_ANY_INSTALL = re.compile(r"\bpip3?\s+(?:install|wheel)\b|-m\s+(?:pip|venv)\b")


@dataclass
class Plan:
    """What the markers above a block say to do with it."""

    block: Block
    kind: str = "run"  # run | skip | synopsis
    reason: str = ""
    replace: list[tuple[str, str]] = field(default_factory=list)
    fixtures: set[str] = field(default_factory=set)
    before: list[str] = field(default_factory=list)
    copy: list[str] = field(default_factory=list)
    continues: bool = False
    output: bool = False
    prints: list[str] = field(default_factory=list)
    xfail: str = ""
    problems: list[str] = field(default_factory=list)


def _placeholders(text: str, plan: Plan) -> None:
    """Note the fixtures the placeholders of ``text`` (a NEW or a COMMAND) start."""
    for m in _BRACES.finditer(text):
        name = m.group(1)
        if not _PLACEHOLDER.fullmatch(m.group(0)):
            plan.problems.append(f"{{{name}}}: no such placeholder (tiny:FAMILY, server, bucket, cwd)")
        elif name.startswith("tiny:"):
            if name[5:] not in TINY:
                plan.problems.append(f"{{{name}}}: no tiny config of that family (tests.support.TINY has {sorted(TINY)})")
            plan.fixtures.add("tiny")
        elif name == "bucket":
            plan.fixtures.add("s3")
        elif name == "server":
            plan.fixtures.add("server")


def _words(text: str) -> list[list[str]]:
    """The options of a run marker, each as its words: shell quoting ("..." or '...'), split at
    every ``;`` outside quotes."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";")
    lexer.whitespace_split = True
    options: list[list[str]] = [[]]
    for word in lexer:
        if word == ";":
            options.append([])
        else:
            options[-1].append(word)
    return [o for o in options if o]


def _run_options(text: str, marker: str, plan: Plan) -> None:
    try:
        options = _words(text)
    except ValueError as e:  # an unclosed quote
        plan.problems.append(f"{marker}: {e}")
        return
    for words in options:
        match words:
            case [old, "->", new]:
                plan.replace.append((old, new))
                _placeholders(new, plan)
            case ["with", name]:
                if name not in FIXTURES:
                    plan.problems.append(f"with {name}: no such fixture (one of {', '.join(sorted(FIXTURES))})")
                plan.fixtures.add(name)
            case ["before", command]:
                plan.before.append(command)
                _placeholders(command, plan)
            case ["copy", path]:
                if not (REPO / path).exists():
                    plan.problems.append(f"copy {path}: no such path in the repository")
                plan.copy.append(path)
            case ["continues"]:
                plan.continues = True
            case ["output"]:
                plan.output = True
            case ["prints", text]:
                plan.prints.append(text)
            case ["xfail", why]:
                plan.xfail = why
            case _:
                plan.problems.append(f"a run option this grammar does not read: {' '.join(words)!r} (in {marker})")


def plan_of(block: Block) -> Plan:
    plan = Plan(block)
    markers = [c for c in block.comments if c.startswith("<!-- doc-test")]
    kinds = []
    for marker in markers:
        m = _MARKER.match(marker)
        if not m:
            plan.problems.append(f"a marker this grammar does not read: {marker}")
            continue
        body = m.group("body")
        if s := re.fullmatch(r"skip \((.*)\)", body):
            kinds.append("skip")
            plan.reason = s.group(1).strip()
            if not plan.reason:
                plan.problems.append("skip () without a reason")
        elif body == "synopsis":
            kinds.append("synopsis")
        elif body == "run" or body.startswith("run;"):
            kinds.append("run")
            _run_options(body[3:], marker, plan)
        else:
            plan.problems.append(f"a marker this grammar does not read: {marker}")
    if len(set(kinds)) > 1:
        plan.problems.append(f"markers of different kinds on one block: {', '.join(sorted(set(kinds)))}")
    plan.kind = kinds[0] if kinds else "run"
    if plan.kind == "run":
        for old, _ in plan.replace:
            if old not in block.text:
                plan.problems.append(f'replace "{old}": no longer in the block (a stale marker)')
        script = script_of(plan)
        if not script.strip() or all(not line.strip() or line.lstrip().startswith("#") for line in script.splitlines()):
            plan.problems.append("nothing left to run once its install lines are dropped: excuse it, skip (installs only)")
        code = "\n".join(line.partition("#")[0] for line in script.splitlines())
        if _ANY_INSTALL.search(code):
            plan.problems.append("installs where the runner cannot leave it out (only a line's `&&`-joined installs are): "
                                 "make it a line of its own")
        if re.search(r"(^|[\s;&|(])(python3? -m )?pytest\b", code, re.M):
            plan.problems.append("runs pytest: a test must not run pytest inside pytest (excuse it, saying who runs it)")
    return plan


def _logical_lines(text: str) -> list[str]:
    """Lines with their ``\\``-continuations joined."""
    out, current = [], ""
    for line in text.splitlines():
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        out.append(current + line)
        current = ""
    if current:
        out.append(current)
    return out


def _without_installs(line: str) -> str:
    """The line without its install commands: of ``a && b && c``, the ones that do not install;
    a line of installs only becomes a comment."""
    code, hash_, comment = line.partition(" #")
    if not code.strip():
        return line
    commands = [c.strip() for c in code.split("&&")]
    kept = [c for c in commands if not _INSTALL.match(c)]
    if len(kept) == len(commands):
        return line
    if not kept:
        return f"# (not run here: installs) {line.strip()}"
    indent = code[:len(code) - len(code.lstrip())]
    return f"{indent}{' && '.join(kept)}  # (installs left out){hash_[1:]}{comment}"


def script_of(plan: Plan) -> str:
    """The text that runs: the replacements applied (placeholders expanded later, per run), install
    lines dropped, a console block's commands only."""
    text = plan.block.text
    for old, new in plan.replace:
        text = text.replace(old, new)
    if plan.block.lang == "python":
        return text
    if plan.block.lang == "console":
        text = "\n".join(line[2:] for line in text.splitlines() if line.startswith("$ "))
    return "\n".join(_without_installs(line) for line in _logical_lines(text)) + "\n"


def _collected() -> list[Block]:
    return [b for b in all_blocks() if b.lang in LANGS]


PLANS = [plan_of(b) for b in _collected()]


def _previous_python(plan: Plan) -> Plan | None:
    earlier = [p for p in PLANS if p.block.path == plan.block.path and p.block.line < plan.block.line
               and p.block.lang == "python"]
    return earlier[-1] if earlier else None


def _chain(plan: Plan) -> list[Plan]:
    """The plans whose text runs as one program: the earlier python blocks it continues, then it."""
    chain = [plan]
    while chain[0].continues and _previous_python(chain[0]) is not None:
        chain.insert(0, _previous_python(chain[0]))
    return chain


#: A block that a later one continues runs once, at the head of that one's program.
_CONTINUED = {id(_previous_python(p)) for p in PLANS if p.continues}
RUN = [p for p in PLANS if p.kind == "run" and not p.problems and id(p) not in _CONTINUED]
SYNOPSES = [p for p in PLANS if p.kind == "synopsis"]


def test_every_block_is_run_or_excused():
    problems = [f"{p.block.where}: {why}" for p in PLANS for why in p.problems]
    # A marker anywhere but right above a collected block reads as nothing: say so.
    collected = {(b.path, b.line) for b in _collected()}
    for b in all_blocks():
        if (b.path, b.line) not in collected and any(c.startswith("<!-- doc-test") for c in b.comments):
            problems.append(f"{b.where}: a doc-test marker above a {b.lang or 'plain'} block, which is not collected")
    for path in {b.path for b in all_blocks()}:
        text = path.read_text(encoding="utf-8").splitlines()
        above = {b.line - 1 - k for b in blocks(path) for k in range(1, len(b.comments) + 1)}
        problems += [f"{path.relative_to(REPO)}:{i + 1}: a doc-test marker that is not right above a code block"
                     for i, line in enumerate(text) if "<!-- doc-test" in line and i not in above]
    for p in PLANS:
        if p.continues and _previous_python(p) is None:
            problems.append(f"{p.block.where}: continues, but no python block before it on its page")
        if p.output and _next_block(p.block) is None:
            problems.append(f"{p.block.where}: output, but no block after it on its page")
    assert not problems, ("doc blocks neither run nor excused (tests/project/test_docs_run.py's docstring gives "
                          "the markers):\n" + "\n".join(problems))


def test_the_readme_main_commands_are_excused():
    """The quick start installs into a fresh venv; the CI command runs the whole suite."""
    readme = [p for p in PLANS if p.block.path.name == "README.md"]
    ci = re.search(r"<!-- ci:test -->(.*?)<!-- /ci:test -->", (REPO / "README.md").read_text(), re.S).group(1)
    assert any(p.kind == "skip" and p.block.text.strip() in ci for p in readme)
    assert readme[0].kind == "skip" and "modelinit init" in readme[0].block.text  # the quick start


def _next_block(block: Block) -> Block | None:
    later = [b for b in blocks(block.path) if b.line > block.line]
    return later[0] if later else None


# ---------------------------------------------------------------------------------------------
# Running a block


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "AZURE_", "AZURITE_", "GOOGLE_")) and k not in ("RAY_ADDRESS", "MODELINIT_TOKEN")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture(scope="module")
def ray_address(s3_server):
    """A local Ray cluster of 2 CPUs for this module (started on first use), its workers in the S3
    server's environment; its address."""
    from tests.support import ray_cluster

    with pytest.MonkeyPatch.context() as patch:
        for k, v in s3_server.env.items():
            patch.setenv(k, v)
        cluster = ray_cluster.start(num_cpus=2)
    yield cluster.address
    cluster.stop(grace=2.0)  # nothing of it is kept: no need to wait out Ray's own slow shutdown


class _Run:
    """One block's folder, environment and placeholders."""

    def __init__(self, request, folder: Path) -> None:
        self.request = request
        self.folder = folder
        self.env = _base_env()
        self.values: dict[str, str] = {"cwd": str(folder)}

    def start(self, plan: Plan) -> None:
        for path in plan.copy:
            source, target = REPO / path, self.folder / path
            target.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if source.is_dir() else shutil.copy2)(source, target)
        if "s3" in plan.fixtures or "ray" in plan.fixtures:
            server = self.request.getfixturevalue("s3_server")
            self.env.update(server.env)
            self.values.setdefault("bucket", server.new_bucket())
        if "ray" in plan.fixtures:
            from tests.support.ray_cluster import DRIVER_ENV

            self.env.update(RAY_ADDRESS=self.request.getfixturevalue("ray_address"), **DRIVER_ENV)
        if "server" in plan.fixtures:
            self.values["server"] = self.request.getfixturevalue("server_target")
        if "torchtitan" in plan.fixtures:  # installed by the tests into tests/.stacks (tests/support/stacks.py)
            from tests.support.stacks import install_torchtitan

            install_torchtitan()
            self.env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        if "dist" in plan.fixtures:
            self.env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1",
                            LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")

    def expand(self, text: str) -> str:
        def value(m: re.Match) -> str:
            name = m.group(1)
            if name.startswith("tiny:"):
                folder = self.folder / f"tiny-{name[5:]}"
                if not folder.exists():
                    folder.mkdir()
                    (folder / "config.json").write_text(json.dumps(TINY[name[5:]], indent=2))
                return str(folder)
            return self.values[name]

        return _PLACEHOLDER.sub(value, text)

    def shell(self, command: str, what: str) -> subprocess.CompletedProcess:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=self.folder, env=self.env,
                              capture_output=True, text=True, timeout=TIMEOUT)
        assert done.returncode == 0, f"{what} failed (exit {done.returncode}):\n$ {command}\n{_tail(done)}"
        return done


def _tail(done: subprocess.CompletedProcess, chars: int = 6000) -> str:
    return f"--- stdout ---\n{done.stdout[-chars:]}\n--- stderr ---\n{done.stderr[-chars:]}"


def _id(plan: Plan) -> str:
    """``docs/training.md:316``, or ``docs/training.md:316+368`` for a block that continues another."""
    chain = _chain(plan)
    return f"{chain[0].block.where}" + "".join(f"+{p.block.line}" for p in chain[1:])


def _unprinted(plan: Plan, stdout: str) -> list[str]:
    """The texts of the plan's ``prints`` options that ``stdout`` does not hold."""
    return [t for t in plan.prints if t not in stdout]


def test_prints_names_each_text_the_run_must_print():
    plan = Plan(PLANS[0].block)
    _run_options('prints "peak RSS"; prints first', "<!-- doc-test: run; ... -->", plan)
    assert plan.prints == ["peak RSS", "first"] and not plan.problems
    assert _unprinted(plan, "model  peak RSS GB\nfirst problem") == []
    assert _unprinted(plan, "model  peak RSS GB") == ["first"]


@pytest.mark.parametrize("plan", [pytest.param(p, marks=pytest.mark.xfail(reason=p.xfail, strict=True)) if p.xfail else p
                                  for p in RUN], ids=[_id(p) for p in RUN])
def test_block_runs_as_written(plan: Plan, request, tmp_path, preforked):
    run = _Run(request, tmp_path)
    run.env["PATH"] = f"{preforked.shims}{os.pathsep}{run.env['PATH']}"  # python and modelinit: its shims
    chain = _chain(plan)
    for p in chain:
        run.start(p)
    for p in chain:
        for command in p.before:
            run.shell(run.expand(command), f"{plan.block.where}: the step before it")
    text = "\n".join(run.expand(script_of(p)) for p in chain)
    if plan.block.lang == "python":
        (tmp_path / "block.py").write_text(text)
        command = [str(preforked.shims / "python"), "block.py"]
    else:
        (tmp_path / "block.sh").write_text(text)
        command = ["bash", "-euo", "pipefail", "block.sh"]
    done = subprocess.run(command, cwd=tmp_path, env=run.env, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, (f"{plan.block.where} failed as written (exit {done.returncode}); what ran:\n"
                                  f"{text}\n{_tail(done)}")
    missing = _unprinted(plan, done.stdout)
    assert not missing, f"{plan.block.where}: its run did not print {missing}; it printed:\n{done.stdout[-3000:]}"
    if plan.output:
        expected = [line.rstrip() for line in _next_block(plan.block).text.strip("\n").splitlines()]
        got = [line.rstrip() for line in done.stdout.rstrip("\n").splitlines()]
        assert got[-len(expected):] == expected, (
            f"{plan.block.where}: its output is no longer the block after it ({_next_block(plan.block).where}); "
            f"the run printed, at its end:\n" + "\n".join(got[-len(expected):]))


# ---------------------------------------------------------------------------------------------
# Synopses


def _synopsis_calls(text: str) -> list[tuple[str | None, list[str]]]:
    """(subcommand or None, --flags) of every ``modelinit`` line."""
    calls = []
    for line in _logical_lines(text):
        code = re.split(r"\s#\s", " " + line, maxsplit=1)[0].strip()
        if not code.startswith("modelinit"):
            continue
        words = code.split()
        sub = words[1] if len(words) > 1 and re.fullmatch(r"[a-z]+", words[1]) else None
        calls.append((sub, re.findall(r"(?<![\w-])--[a-z][\w-]*", code)))
    return calls


@pytest.mark.parametrize("plan", SYNOPSES, ids=[p.block.where for p in SYNOPSES])
def test_synopsis_names_real_commands_and_flags(plan: Plan):
    helps: dict[str | None, str] = {}
    problems = []
    calls = _synopsis_calls(plan.block.text)
    assert calls, f"{plan.block.where}: a synopsis with no modelinit line"
    for sub, flags in calls:
        if sub not in helps:
            done = subprocess.run(["modelinit", *([sub] if sub else []), "--help"], env=_base_env(),
                                  capture_output=True, text=True, timeout=TIMEOUT)
            if done.returncode != 0:
                problems.append(f"modelinit {sub} --help: exit {done.returncode}: {done.stderr.strip()[-300:]}")
            helps[sub] = done.stdout
        problems += [f"modelinit {sub or ''}: {flag} is not in its --help"
                     for flag in flags if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", helps[sub])]
    assert not problems, f"{plan.block.where}: the synopsis no longer matches the CLI:\n" + "\n".join(problems)
