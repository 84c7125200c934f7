"""The CLI: embedded init and plan, one-line errors with a non-zero exit, a real `serve`."""
import json
import subprocess
import sys

import pytest

from tests.conftest import TINY


def run(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "modelinit.cli", *args], capture_output=True, text=True, timeout=timeout)


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
