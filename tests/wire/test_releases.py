"""The releases that decide the bytes, against modelinit's declared floors (modelinit_wire.releases):
``modelinit versions`` marks one below its floor in its bug report, and such a release is refused in one
line naming the package, the version found and the one needed, before anything is built or written.

The end-to-end cases run the CLI in a process whose ``importlib.metadata.version`` reports an old
release of one package (what an environment with that release installed reports), so no old wheel
is installed."""
from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import pytest

from modelinit_wire import releases

#: A process whose installed ``torch`` reads as 2.5.1 (transformers >= 5.23 disables its PyTorch
#: backend below 2.6: the case the floor's one line replaces an empty "use one of:" for).
OLD = """
import importlib.metadata as m, sys
version = m.version
m.version = lambda name: {old!r} if name == {name!r} else version(name)
from modelinit.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _cli(name: str, old: str, *args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", OLD.format(name=name, old=old), *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def test_the_floors_are_modelinits_declared_ones():
    required = " ".join(importlib.metadata.requires("modelinit"))
    for name in ("torch", "transformers", "numpy", "numba", "safetensors"):
        assert f"{name}>={releases.floor(name)}" in required, name
    assert releases.floor("no-such-package") is None
    assert releases.floor("pytest") is None  # the test extra's bounds are what the tests need, not floors
    assert releases.floor("numpy") != "2.0.2"  # the server's numpy floor, not the test extra's (mup's pandas)


@pytest.fixture()
def reread():
    """The versions read afresh during the test (they are read once per process), and after it."""
    releases.installed.cache_clear()
    yield
    releases.installed.cache_clear()


@pytest.mark.parametrize("have, below", [("2.5.1", True), ("2.10.9", True), ("2.11.0", False), ("2.11.0rc1", False),
                                         ("2.13.0+cpu", False), ("3.0", False)])
def test_a_release_is_compared_by_its_numbers(monkeypatch, reread, have, below):
    version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda n: have if n == "torch" else version(n))
    assert (releases.below_floor("torch") is not None) is below
    line = releases.below("numpy", "torch")
    assert (line == f"torch {have} is installed; modelinit needs torch>={releases.floor('torch')} (the oldest release "
                    f"it has run on): pip install -U 'torch>={releases.floor('torch')}'") if below else line is None


def test_an_installed_release_is_read_once(monkeypatch, reread):
    """The metadata is read once per process (a scan of every distribution, on a path each request
    takes several times); the version that counts is the one this process imported."""
    reads = []
    version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda n: reads.append(n) or version(n))
    assert releases.installed("torch") == releases.installed("torch") == version("torch")
    assert releases.below("torch", "torch") is None and reads == ["torch"]


@pytest.mark.slow
def test_torch_below_the_floor_is_one_line_naming_it(tmp_path):
    """A transformers architecture with torch 2.5.1: one line naming torch, 2.5.1 and the floor (not
    transformers' empty "use one of:"), nothing written; ``modelinit versions`` marks it."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], "hidden_size": 32,
                                  "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                                  "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 64}))
    out = tmp_path / "out"
    done = _cli("torch", "2.5.1", "init", str(config), "--out", str(out))
    floor = releases.floor("torch")
    assert done.returncode != 0 and not out.exists()
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"torch 2.5.1 is installed; modelinit needs torch>={floor}" in lines[0], done.stderr
    assert "use one of" not in done.stderr
    report = _cli("torch", "2.5.1", "versions")
    assert report.returncode == 0 and f"torch          2.5.1  (below modelinit's floor {floor}: refused)" in report.stdout
    assert json.loads(_cli("torch", "2.5.1", "versions", "--json").stdout)["below_floor"] == {"torch": floor}


@pytest.mark.slow
def test_numba_below_the_floor_is_refused_before_generating(tmp_path):
    """A built-in family on the CPU kernel with numba 0.60: refused in one line by the device, nothing written."""
    out = tmp_path / "out"
    done = _cli("numba", "0.60.0", "init", "gpt2", "--out", str(out))
    assert done.returncode != 0 and not out.exists()
    assert done.stderr.strip().splitlines() == [
        f"modelinit: error: device: numba 0.60.0 is installed; modelinit needs numba>={releases.floor('numba')} (the "
        f"oldest release it has run on): pip install -U 'numba>={releases.floor('numba')}'"], done.stderr
