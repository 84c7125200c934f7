"""The CLI: embedded init and plan, one-line errors with a non-zero exit, a real `serve`."""
import json
import subprocess
import sys

import pytest

from tests.support import TINY


def run(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "modelinit.cli", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_init_embedded_then_through_a_server(tmp_path, server_process):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY["bert"]))
    r = run("init", str(cfg), "--seed", "4", "--out", str(tmp_path / "a"), "--dtype", "bfloat16")
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stdout and (tmp_path / "a" / "modelinit.json").exists()
    proc = server_process()
    r = run("init", str(cfg), "--seed", "4", "--out", str(tmp_path / "b"), "--dtype", "bfloat16", "--server", proc.target)
    assert r.returncode == 0, r.stderr
    for name in ("model.safetensors", "config.json", "modelinit.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_plan_json_and_table(tmp_path):
    r = run("plan", "gpt2", "--json", "--dtype", "bfloat16")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["architecture"] == "GPT2LMHeadModel" and int(plan["total_params"]) == 124_439_808
    r = run("plan", "gpt2")
    assert r.returncode == 0 and "transformer.h.11.mlp.c_proj.weight" in r.stdout


@pytest.mark.parametrize("args, field", [
    (["init", "no-such-model", "--out", "X"], "spec.preset"),
    (["init", "gpt2", "--dtype", "int3", "--out", "X"], "dtype"),
    (["init", "gpt2", "--max-shard-size", "0", "--out", "X"], "max_shard_size"),
    (["init", "gpt2", "--seed", "-3", "--out", "X"], "seed"),
    (["plan", "missing-dir/config.json"], "spec"),
])
def test_bad_input_is_one_line_and_nonzero(tmp_path, args, field):
    args = [str(tmp_path / a) if a == "X" else a for a in args]
    r = run(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("modelinit: error: ") and field in lines[0]
    assert not (tmp_path / "X").exists()


def test_serve_refuses_cuda_without_an_engine():
    r = run("serve", "--device", "cuda", "--port", "0")
    assert r.returncode == 2 and "device" in r.stderr


# --- the console script's exit ------------------------------------------------------------------

_RUN = """
import atexit, sys, threading, time
class Finalized:
    def __del__(self):
        sys.stderr.write("torn down\\n")
kept = Finalized()  # the interpreter's teardown would finalize it
atexit.register(lambda: sys.stderr.write("exit handler ran\\n"))
if sys.argv[1] == "thread":
    threading.Thread(target=lambda: (time.sleep(0.5), sys.stderr.write("thread finished\\n"))).start()
sys.argv[1:] = sys.argv[2:]
from modelinit.cli import run
run()
"""


@pytest.mark.parametrize("args, code", [(["plan", "gpt2"], 0), (["plan", "no-such-model"], 2)])
def test_the_console_script_ends_without_the_interpreters_teardown(args, code):
    """``run`` (the ``modelinit`` script) skips the teardown of numba's object graph (~0.1-0.25 s
    per job) yet does what an exit must: exit handlers run, output is flushed, the code kept."""
    out = subprocess.run([sys.executable, "-c", _RUN, "plain", *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == code, out.stderr
    assert "exit handler ran" in out.stderr
    assert "torn down" not in out.stderr
    if code == 0:
        assert "parameters" in out.stdout  # flushed although the process ended with os._exit
    else:
        assert out.stderr.startswith("modelinit: error:")


def test_the_console_script_waits_for_a_thread_still_running():
    out = subprocess.run([sys.executable, "-c", _RUN, "thread", "plan", "gpt2"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "thread finished" in out.stderr and "exit handler ran" in out.stderr


_GC = """
import gc
gc.set_threshold(700, 10, 10)  # CPython's default, whatever the interpreter started with
from modelinit.cli import entry
entry.main = lambda: print(gc.get_threshold(), flush=True) or 0
entry.run()
"""


def test_the_console_script_collects_garbage_less_often_and_main_leaves_a_callers_setting(capsys):
    """The console script owns its process: its command runs at ``GC_THRESHOLDS`` (importing torch and
    transformers at CPython's default spends a tenth of a probe in the collector). ``main``, the same
    command line called from a program, leaves that program's setting as it was."""
    import gc

    from modelinit.cli import entry, main

    out = subprocess.run([sys.executable, "-c", _GC], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(entry.GC_THRESHOLDS) != str((700, 10, 10))
    before = gc.get_threshold()
    gc.set_threshold(1234, 5, 6)  # a caller's own, unlike both
    try:
        assert main(["versions"]) == 0
        assert gc.get_threshold() == (1234, 5, 6)
    finally:
        gc.set_threshold(*before)
    capsys.readouterr()


def test_versions_reports_what_decides_the_bytes_without_importing_it(capsys):
    """``modelinit versions`` (a bug report's first lines): every distribution that decides the bytes or
    is a mapped stack, with its installed version or ``-``, read from metadata: nothing heavy imported."""
    from importlib.metadata import version

    from modelinit.cli import commands, main

    assert main(["versions", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report["packages"]) == list(commands.VERSIONED)
    assert report["packages"]["torch"] == version("torch") and report["packages"]["modelinit"] == version("modelinit")
    assert report["python"] == sys.version.split()[0]
    code = ("import sys; from modelinit.cli import main; main(['versions']); "
            "print(sorted(m for m in ('torch', 'numpy', 'numba', 'transformers', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert "numba" in out.stdout and "transformers" in out.stdout
