"""The command the tests' own installs run (torchtitan and mup into tests/.stacks, checkov into its
venv): ``uv pip install`` where uv is installed (the test extra holds it: seconds, where pip takes a
minute or more, mostly compiling every module it installs), else ``python -m pip install``."""
from __future__ import annotations

import shutil
import sys


def uv() -> str | None:
    """The uv executable: the one the ``uv`` package installed, else one on PATH, else None."""
    try:
        from uv import find_uv_bin
    except ImportError:
        return shutil.which("uv")
    try:
        return find_uv_bin()
    except FileNotFoundError:
        return shutil.which("uv")


def pip_install(*args: str, python: str | None = None) -> list[str]:
    """The argv that installs ``args`` (requirements and pip options that uv shares: --quiet,
    --no-deps, --target) for ``python`` (default: this interpreter)."""
    python = python or sys.executable
    exe = uv()
    if exe:
        return [exe, "pip", "install", "--python", python, *args]
    return [python, "-m", "pip", "install", *args]
