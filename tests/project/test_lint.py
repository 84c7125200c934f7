"""Static checks CI runs with the tests: ruff over the tree (pyflakes and error-level pycodestyle,
configured in pyproject.toml) and mypy over the client package (the thin, typed public API)."""
from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

from tests.support import REPO



def _tool(name: str) -> str:
    path = shutil.which(name, path=str(pathlib.Path(sys.executable).parent)) or shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; it is in the 'test' extra (pip install -e '.[test]')")
    return path


def test_ruff():
    out = subprocess.run([_tool("ruff"), "check", "."], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_mypy_client_package():
    out = subprocess.run([_tool("mypy"), "client/modelinit", "proto/modelinit_host", "proto/modelinit_wire"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
