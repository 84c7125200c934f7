"""The import layering of pyproject.toml's [tool.importlinter] contracts, checked by `lint-imports`:
the client package's layers (no import cycles), the wire layer the server shares, a client that
imports no server code (but through modelinit.embedded) and no torch/numpy/numba/transformers, and
an engine without grpc. import-linter reads the imports inside functions too."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from .conftest import REPO


def test_import_contracts_hold(tmp_path):
    exe = shutil.which("lint-imports", path=os.path.dirname(sys.executable)) or shutil.which("lint-imports")
    if exe is None:
        pytest.fail("lint-imports not found: pip install -e '.[test]' (import-linter)")
    # The source trees first on the path: the contracts are about this checkout, installed or not.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "client"), str(REPO / "server"), str(REPO / "proto"),
                                                        os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([exe, "--no-logo", "--cache-dir", str(tmp_path)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout, r.stdout


def test_server_loads_no_client_module():
    """What the server shares with the client is in modelinit_wire: starting the server's modules
    (service, embedded engine, training) loads no module of the client package."""
    code = ("import sys, modelinit_server.service.command, modelinit_server.service.embedded, modelinit_server.training; "
            "print(sorted(m for m in sys.modules if m == 'modelinit' or m.startswith('modelinit.')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout


def test_wire_loads_neither_side():
    code = ("import sys, modelinit_wire.v1.modelinit_pb2_grpc, modelinit_wire.events, modelinit_wire.credentials, "
            "modelinit_wire.policy_file, modelinit_wire.constants; "
            "print(sorted(m.partition('.')[0] for m in sys.modules if m.partition('.')[0] in ('modelinit', 'modelinit_server')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout
