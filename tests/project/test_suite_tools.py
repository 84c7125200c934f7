"""The suite's own machinery (tests/README.md, "Running them"): work done once per run across the
parallel workers (tests/support/once.py), the worlds of ranks forked from a fork server
(tests/support/distributed.spawn), Python programs forked from a preloaded server as a fresh
interpreter runs them (tests/support/preforked.py, the docs run's), and a run that ends with its
slowest tests (tests/support/durations.py, registered by tests/conftest.py)."""
from __future__ import annotations

import multiprocessing
import os
import pathlib
import subprocess
import sys

import pytest

from tests.support import REPO, wait_until
from tests.support.distributed import spawn
from tests.support.once import once
from tests.support.preforked import Preforked


class _Factory:
    """What :func:`once` reads of pytest's tmp_path_factory."""

    def __init__(self, base: pathlib.Path) -> None:
        self.base = base

    def getbasetemp(self) -> pathlib.Path:
        return self.base


def _make_once(base: str, log: str) -> None:
    def make(folder: pathlib.Path) -> None:
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        (folder / "value").write_text("made")

    folder = once(_Factory(pathlib.Path(base)), "shared", make)
    assert (folder / "value").read_text() == "made"


def test_once_makes_its_folder_once_whoever_asks(tmp_path):
    """Four processes ask at once: one makes the folder, the others wait for it and read it."""
    log = tmp_path / "makers"
    procs = [multiprocessing.get_context("fork").Process(target=_make_once, args=(str(tmp_path), str(log))) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 4
    assert len(log.read_text().split()) == 1


def test_once_leaves_nothing_when_making_fails_and_the_next_caller_makes_it(tmp_path):
    def fail(folder: pathlib.Path) -> None:
        (folder / "half").write_text("written before the failure")
        raise RuntimeError("no")

    with pytest.raises(RuntimeError, match="no"):
        once(_Factory(tmp_path), "k", fail)
    assert not (tmp_path / "once-k").exists()
    folder = once(_Factory(tmp_path), "k", lambda f: (f / "value").write_text("second"))
    assert (folder / "value").read_text() == "second" and not (folder / "half").exists()


def _report(rank: int, out: str) -> None:
    import torch

    pathlib.Path(out, f"rank{rank}").write_text(
        "\n".join([os.environ.get("MODELINIT_TEST_LATE", ""), str("late-entry" in sys.path), str(torch.get_num_threads())]))


@pytest.mark.slow
def test_spawned_ranks_see_the_environment_and_path_of_the_call(tmp_path, monkeypatch):
    """The fork server keeps the environment of its own start; each rank gets the caller's as it is
    at the call (a variable and a sys.path entry set after an earlier world started the server)."""
    (tmp_path / "first").mkdir()
    spawn(_report, (str(tmp_path / "first"),), 1)  # the fork server started, if no earlier world did
    monkeypatch.setenv("MODELINIT_TEST_LATE", "set after the fork server started")
    monkeypatch.syspath_prepend("late-entry")
    (tmp_path / "second").mkdir()
    spawn(_report, (str(tmp_path / "second"),), 2)
    for rank in (0, 1):
        late, on_path, threads = (tmp_path / "second" / f"rank{rank}").read_text().split("\n")
        assert late == "set after the fork server started" and on_path == "True"
        assert threads == os.environ.get("OMP_NUM_THREADS", "1")


def _fails_on_rank_one(rank: int) -> None:
    assert rank != 1, "rank 1 refuses"


@pytest.mark.slow
def test_a_failing_rank_fails_the_caller_with_its_error():
    with pytest.raises(Exception, match="rank 1 refuses"):
        spawn(_fails_on_rank_one, (), 2)


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["0", "1"])
def test_a_run_ends_with_its_slowest_tests(workers):
    """The last lines of a run, in this process or over an xdist worker, name its slowest tests with
    their seconds, after pytest's own summary. The module run is a quick one whose tests take
    different times (so the order is checked on distinct figures). One worker is enough: its
    reports reach the controller as every worker's do (two cost one more process importing the
    suite's conftest, about 4 s)."""
    module = "tests/server/core/test_layout.py"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", workers, module],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.rstrip("\n").split("\n")
    head = next(i for i, line in enumerate(lines) if "slowest" in line and "(setup + call + teardown)" in line)
    assert " passed" in lines[head - 1]  # pytest's own last line comes before
    shown = lines[head + 1:]
    assert 0 < len(shown) <= 20 and all(line.split()[1].startswith(module + "::") for line in shown), shown
    seconds = [float(line.split()[0].rstrip("s")) for line in shown]
    assert seconds == sorted(seconds, reverse=True)


def test_every_background_install_names_a_real_installer_and_real_tests():
    """tests/support/installs.py names each install by module and function, and the tests needing it
    by path: a rename on either side would silently drop the install back into the tests."""
    import importlib

    from tests.support.installs import INSTALLS

    for name, (module, function, prefixes) in INSTALLS.items():
        assert callable(getattr(importlib.import_module(module), function, None)), name
        assert all(list(REPO.glob(p.rstrip("/") + ("*" if not p.endswith((".py", "/")) else ""))) for p in prefixes), name


def test_torchtitan_skips_only_for_what_torch_lacks():
    """install_torchtitan skips where torchtitan takes a name this torch lacks (torchtitan 0.3.0 on torch
    2.11: ``DataParallelMeshDims``, seen on the GPU image); an import error of its own still fails."""
    from tests.support.stacks import names_torch

    def error_of(statement: str) -> ImportError:
        with pytest.raises(ImportError) as e:
            exec(statement, {})
        return e.value

    assert names_torch(error_of("from torch.distributed.fsdp import NoSuchNameInTorch"))
    assert names_torch(error_of("import torch.no_such_module_in_torch"))
    assert not names_torch(error_of("from tests.support import no_such_name"))
    assert not names_torch(error_of("import no_such_module_of_a_stack"))
    assert not names_torch(error_of("import torchdata_no_such"))


# ---------------------------------------------------------------------------------------------
# Preforked programs: what a fresh interpreter would do, compared with one


@pytest.fixture(scope="module")
def light_server():
    """A server that preloads a light module (the machinery is what is tested; the docs run's
    server preloads torch and transformers)."""
    server = Preforked(preload=("json",))
    assert server.ready(timeout=60), (server.folder / "server.log").read_text()
    yield server
    server.stop()


_PROGRAM = """\
import atexit, os, sys, threading, time
print("argv", sys.argv, "name", __name__, "file", __file__)
print("cwd", os.getcwd(), "env", os.environ.get("PREFORKED_TEST"))
print("path", sys.path)
print("stdin", sys.stdin.read())
open("unclosed.txt", "w").write("flushed at exit")
threading.Thread(target=lambda: (time.sleep(0.2), print("the thread ended", flush=True))).start()
atexit.register(print, "atexit ran")
if len(sys.argv) > 1:
    sys.exit(int(sys.argv[1]) if sys.argv[1].isdigit() else sys.argv[1])
"""


def _both(server, tmp_path, script: str, *args: str, env: dict[str, str] | None = None):
    """The script run by a fresh interpreter and by the preforked server, each in a folder of its
    own, ``env`` added to the environment: (fresh, forked) CompletedProcess."""
    runs = []
    for how in ("run-fresh", "run-forked"):
        folder = tmp_path / how
        folder.mkdir()
        (folder / "program.py").write_text(script)
        environ = {**os.environ, "PREFORKED_TEST": how, "PYTHONPATH": str(tmp_path / "extra"), **(env or {})}
        command = [sys.executable, "program.py", *args]
        if how == "run-forked":
            command[0] = str(server.shims / "python")
        runs.append(subprocess.run(command, cwd=folder, env=environ, input="from stdin", capture_output=True, text=True,
                                   timeout=60))
    return runs


@pytest.mark.parametrize("args", [(), ("3",), ("a message",)])
def test_a_preforked_program_runs_as_a_fresh_interpreter_runs_it(light_server, tmp_path, args):
    """argv, __name__, __file__, the working directory, the environment, sys.path (PYTHONPATH's
    entries included), stdin, and at the end: the thread joined, atexit run, an open file flushed,
    the exit status and stderr of sys.exit."""
    fresh, forked = _both(light_server, tmp_path, _PROGRAM, *args)
    assert forked.stdout.replace("run-forked", "run-fresh") == fresh.stdout, (fresh.stdout, forked.stdout)
    assert "the thread ended" in fresh.stdout and "atexit ran" in fresh.stdout
    assert (forked.returncode, forked.stderr) == (fresh.returncode, fresh.stderr) == (
        {(): 0, ("3",): 3, ("a message",): 1}[args], {("a message",): "a message\n"}.get(args, ""))
    assert (tmp_path / "run-forked" / "unclosed.txt").read_text() == "flushed at exit"


def test_a_preforked_program_that_raises_prints_the_interpreters_traceback(light_server, tmp_path):
    fresh, forked = _both(light_server, tmp_path, "def f():\n    raise ValueError('no')\nf()\n")
    assert forked.returncode == fresh.returncode == 1
    assert forked.stderr == fresh.stderr.replace("run-fresh", "run-forked") and "ValueError: no" in fresh.stderr


def test_the_shims_run_the_console_script_and_leave_other_forms_to_the_interpreter(light_server, tmp_path):
    env = {**os.environ, "PATH": f"{light_server.shims}{os.pathsep}{os.environ['PATH']}"}
    real = subprocess.run(["modelinit", "--help"], capture_output=True, text=True, timeout=60)
    shim = subprocess.run(["modelinit", "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert (shim.returncode, shim.stdout) == (real.returncode, real.stdout) == (0, real.stdout)
    other = subprocess.run(["bash", "-c", "python -c 'import sys; print(sys.argv, sys.flags.isolated)' x"],
                           env=env, capture_output=True, text=True, timeout=60)
    assert other.stdout == "['-c', 'x'] 0\n", other.stderr  # the real interpreter, not the shim's -IS


def test_a_preforked_program_dies_with_its_callers_timeout(light_server, tmp_path):
    (tmp_path / "sleeps.py").write_text("import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)\n")
    pid_file = tmp_path / "pid"
    with open(pid_file, "w") as out, pytest.raises(subprocess.TimeoutExpired):
        light_server.run(["sleeps.py"], cwd=tmp_path, stdout=out, timeout=2)
    pid = int(pid_file.read_text())

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(gone, what=f"the program (pid {pid}) to be killed with its shim")


def test_without_a_server_the_shims_run_the_real_interpreter(tmp_path):
    server = Preforked(preload=())
    assert server.ready(timeout=60)
    server.process.terminate()
    server.process.wait(timeout=30)
    (tmp_path / "p.py").write_text("import sys; print('ran', sys.argv[1:])")
    done = server.run(["p.py", "a"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    server.stop()
    assert (done.returncode, done.stdout) == (0, "ran ['a']\n"), done.stderr


@pytest.mark.slow
def test_a_preforked_program_takes_its_tmpdir_though_the_preload_asked_for_one(preforked, tmp_path):
    """The server that preloads torch and transformers (they ask tempfile for its folder, which it
    keeps): a program still gets the TMPDIR of its own environment, as a fresh interpreter does."""
    (tmp_path / "extra").mkdir()
    script = "import tempfile\nprint(tempfile.gettempdir())\n"
    fresh, forked = _both(preforked, tmp_path, script, env={"TMPDIR": str(tmp_path / "extra")})
    assert fresh.stdout == forked.stdout == f"{tmp_path / 'extra'}\n", (fresh, forked)
