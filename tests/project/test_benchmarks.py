"""Every script in benchmarks/ runs, in a small mode, in a process of its own (forked from the
preloaded server of tests/support/preforked.py, as a fresh interpreter runs it): a name they use that moved or
was renamed breaks a test here instead of a benchmark nobody runs (issue 42: floor.py's
``--timeline`` patched ``modelinit.client.write_files`` long after it moved to ``modelinit.writer``, now
``modelinit.destinations.folder``).

No figure is asserted (timings never go in pass/fail tests): only that each script exits 0 and
prints its report's labels. One case per script (the id names it), each in the smallest mode it has:

* ``std_normal_cdf``, ``engine_cpu``: one repetition, 64K elements, one thread.
* ``engine_gpu``: 4096 elements, one launch; without CUDA the script says so and exits 1 after its
  imports: that is checked and the case skips (the CUDA part runs in benchmarks/gpu_session.sh).
* ``floor``: bert-base-uncased (the smallest preset; floor plans presets only), one rep, on the CPU
  (``--device cuda`` needs a GPU); ``floor --timeline``: one in-process job, each patched stage
  reported (a patch that misses its name leaves its stage out).
* ``end_to_end``: the tiny gpt2 config.json, one rep, one rep of the baselines: it runs all three
  of benchmarks/baselines/ (hf_init_save, torch_loop, grpc_ceiling), each given the same config.
* ``object_store``: a tiny gpt2 config.json, one repeat, parts 1, no iterator ceiling (moto).
* ``probe``: run by project/test_docs_run.py as docs/probe.md's Reproduce block writes it (both modes,
  the tiny gpt2 config, each mode's report label checked); here only that the block still does.
* ``verify``: ``--smoke`` (a tiny Llama in four files).
* ``init_module``: its ``smoke`` shape (a small Llama) with one layer, float32, one repeat, CPU
  (``--device cuda`` needs a GPU).
* ``init_module_ranks``: its ``smoke`` shape, world 1, layout tp (its worker imports what fsdp uses
  too), one layer, one repeat, one thread.
* ``init_module_stacks``: a real run of both stacks in their smallest flavor (torchtitan's
  ``debugmodel``, one repeat); torchtitan comes from tests/support/stacks.py (skips without a
  package index and no copy), megatron-core from the test extra.
* ``init_module_stack_ranks``: both stacks at world 2 only (Megatron at TP=2, torchtitan under
  FSDP2: the sharded paths; world 1 adds only a process start), torchtitan's ``debugmodel`` cut to
  one layer, one repeat, the JSON written.
* ``soak``: not run here: tests/server/service/test_soak_smoke.py runs it in a small mode (this
  only checks that it does).
* ``gpu_session.sh``: ``bash -n`` and every script and test module it names exists (its steps
  need a GPU).

Measured on the 2-core development machine (shared): 118 s for the module before
init_module_stack_ranks came (about 143 s with it), over its 90 s target; end_to_end ~30 s (ten
processes: warm-up, embedded, both baselines, server, library call, two ceilings),
init_module_stack_ranks ~25 s (four ranks' start-up; 14 s since its ranks fork from a fork server that
imported the stacks once), init_module ~19 s, init_module_ranks and
init_module_stacks ~17 s each, object_store ~10 s (probe ~7 s and its coordinate-check case ~10 s until
docs/probe.md's run took them over, 2026-12-07),
the rest under 6 s each: mostly the imports of torch and transformers, which the preloaded server
spares them since 2026-12-07 (the module's summed seconds in a fresh clone 85 to 63).
"""
from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from tests.support import REPO, TINY

pytestmark = pytest.mark.slow  # subprocesses, and the server they fork from

BENCH = REPO / "benchmarks"
TIMEOUT = 300


@pytest.fixture
def run(preforked, tmp_path):
    """``run(args)``: ``python *args`` in the repository's root, TMPDIR the test's folder, the
    script forked from the preloaded server as a fresh interpreter would run it
    (tests/support/preforked.py; its own children, ranks among them, are fresh interpreters)."""
    def run(args: list[str]) -> subprocess.CompletedProcess:
        return preforked.run(args, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT,
                             env={**os.environ, "TMPDIR": str(tmp_path)})

    return run


def ok(done: subprocess.CompletedProcess, *labels: str) -> None:
    """The script exited 0 and printed each of ``labels`` (the report's lines, never their figures)."""
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for label in labels:
        assert label in done.stdout, (label, done.stdout[-3000:])


@pytest.fixture
def tiny_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY["gpt2"]))
    return path


def test_std_normal_cdf(run):
    ok(run([str(BENCH / "std_normal_cdf.py"), "--repeat", "1"]))


def test_engine_cpu(run):
    ok(run([str(BENCH / "engine_cpu.py"), "--n", "64K", "--threads", "1", "--repeat", "1", "--reference-n", "16K"]),
       "kernel", "torch", "numpy reference")


def test_engine_gpu(run):
    done = run([str(BENCH / "engine_gpu.py"), "--elements", "4096", "--repeats", "1"])
    if done.returncode == 1 and "no CUDA device" in done.stderr:
        pytest.skip("no CUDA: its imports ran and it refused as it should; the CUDA part runs in gpu_session.sh")
    ok(done)


def test_floor(run, tmp_path):
    ok(run([str(BENCH / "floor.py"), "--model", "bert-base-uncased", "--reps", "1", "--device", "cpu",
            "--dir", str(tmp_path), "--json", str(tmp_path / "floor.json")]),
       "compute floor", "floor = max(a, b)", "modelinit init (embedded")
    assert {"floor", "ratio", "median"} <= json.loads((tmp_path / "floor.json").read_text()).keys()


def test_floor_timeline(run, tmp_path):
    done = run([str(BENCH / "floor.py"), "--timeline", "--model", "bert-base-uncased", "--dir", str(tmp_path)])
    # each stage's line appears only if its patch hit the name the job calls
    ok(done, "timeline of one in-process job", "fill wall", "write wall", "sha256 update wall",
       "writer waits for the next event")


def test_end_to_end(run, tmp_path, tiny_config):
    ok(run([str(BENCH / "end_to_end.py"), "--model", str(tiny_config), "--reps", "1", "--hf-reps", "1",
            "--dir", str(tmp_path)]),
       "embedded default:", "transformers:", "plain PyTorch loop:", "served + CLI client:", "raw gRPC ceiling:")


def test_object_store(run, tmp_path, tiny_config):
    pytest.importorskip("moto")
    ok(run([str(BENCH / "object_store.py"), "--model", str(tiny_config), "--parts", "1", "--repeat", "1",
            "--no-iter-ceiling", "--dir", str(tmp_path), "--json", str(tmp_path / "os.json")]),
       "modelinit to S3 / the library's own upload", "scaling:")


def test_probe_runs_as_docs_probe_md_reproduces_it():
    """probe.py runs, both modes, in docs/probe.md's Reproduce block (project/test_docs_run.py runs it
    as written, on the tiny gpt2 config, and checks each mode's report label): a second run here
    would repeat those two processes. This checks that the block still does both."""
    from tests.support.doc_blocks import blocks

    (block,) = [b for b in blocks(REPO / "docs" / "probe.md") if "python benchmarks/probe.py" in b.text]
    runs = [line for line in block.text.splitlines() if line.startswith("python benchmarks/probe.py")]
    assert len(runs) == 2 and any("--widths" in r for r in runs) and not all("--widths" in r for r in runs)
    marker = " ".join(block.comments)
    assert '"benchmarks/probe.py" -> "benchmarks/probe.py --models {tiny:gpt2}' in marker
    assert 'prints "probed params"' in marker and 'prints "first problem"' in marker  # each mode's table


def test_verify(run):
    ok(run([str(BENCH / "verify.py"), "--smoke", "--repeat", "1"]), "verify --no-regenerate", "speed-up")


def test_init_module(run):
    ok(run([str(BENCH / "init_module.py"), "--shape", "smoke", "--layers", "1", "--dtype", "float32", "--repeat", "1"]),
       "init_module_")


def test_init_module_ranks(run):
    ok(run([str(BENCH / "init_module_ranks.py"), "--shape", "smoke", "--worlds", "1", "--layout", "tp", "--layers", "1",
            "--repeat", "1", "--threads", "1"]), "tp")


def test_init_module_stacks(run):
    from tests.support.stacks import install_torchtitan

    install_torchtitan()  # puts tests/.stacks on PYTHONPATH, which the subprocess inherits
    pytest.importorskip("megatron.core")
    ok(run([str(BENCH / "init_module_stacks.py"), "--flavor", "debugmodel", "--repeat", "1", "--stack", "both"]),
       "init_module_", "Megatron's own CPU init")


def test_init_module_stack_ranks(run, tmp_path):
    from tests.support.stacks import install_torchtitan

    install_torchtitan()
    pytest.importorskip("megatron.core")
    ok(run([str(BENCH / "init_module_stack_ranks.py"), "--flavor", "debugmodel", "--layers", "1", "--worlds", "2",
            "--repeat", "1", "--json", str(tmp_path / "stack_ranks.json")]),
       "Megatron's CPU init", "torchtitan init_states()", "ratio cpu")
    assert set(json.loads((tmp_path / "stack_ranks.json").read_text())["results"]) == {"megatron", "torchtitan"}


def test_soak_has_its_own_smoke_test():
    smoke = REPO / "tests" / "server" / "service" / "test_soak_smoke.py"
    assert "benchmarks\" / \"soak.py\"" in smoke.read_text()


def test_gpu_session_sh():
    script = BENCH / "gpu_session.sh"
    syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    named = set(re.findall(r"(?:benchmarks|tests)/[\w/]+\.py", script.read_text()))
    assert named and not [p for p in named if not (REPO / p).is_file()]


COVERED = {"std_normal_cdf", "engine_cpu", "engine_gpu", "floor", "end_to_end", "object_store", "probe", "verify",
           "init_module", "init_module_ranks", "init_module_stacks", "init_module_stack_ranks", "soak",
           "gpu_session.sh",
           "baselines/hf_init_save", "baselines/torch_loop", "baselines/grpc_ceiling"}  # baselines: by end_to_end


def test_every_script_has_a_case():
    scripts = {str(p.relative_to(BENCH).with_suffix("")) for p in BENCH.rglob("*.py")} | {"gpu_session.sh"}
    assert scripts == COVERED, "a script in benchmarks/ without a case here (or a case without its script)"
