"""checkov, the independent scanner that tests/project/test_scan.py runs over deploy/'s manifests,
installed by the tests themselves.

checkov pins dozens of its dependencies exactly (boto3, networkx, packaging, ...), which the
project's own environment cannot hold beside its own, so :func:`install_checkov` installs the
pinned release into a venv of its own, ``tests/.scanner`` (once, under a file lock, as
tests/support/stacks.py installs torchtitan), and returns its ``checkov`` executable. It skips
only when the installer (uv, else pip) cannot reach a package index and no copy is there. The first install takes about
a minute and a half; a scan of every rendered manifest about 6 seconds on 2 cores.
"""
from __future__ import annotations

import fcntl
import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.support.installer import pip_install

CHECKOV = "checkov==3.3.30"
"""The release the tests run against (what docs/deploy.md names)."""
HERE = pathlib.Path(__file__).resolve().parents[1] / ".scanner"
_EXE = HERE / "bin" / "checkov"
_DONE = HERE / ".installed"
"""Holds CHECKOV once the install has finished: a venv cut short by a timeout is made again."""


def install_checkov() -> pathlib.Path:
    """The ``checkov`` executable of tests/.scanner, installed there first when it is missing."""
    HERE.mkdir(exist_ok=True)
    with open(HERE.parent / ".scanner.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be installing it: wait for it
        if not _DONE.is_file() or _DONE.read_text().strip() != CHECKOV:
            base = getattr(sys, "_base_executable", sys.executable)  # not the project's venv
            steps = [[base, "-m", "venv", "--clear", str(HERE)],
                     pip_install("--quiet", CHECKOV, python=str(HERE / "bin" / "python"))]
            for step in steps:
                done = subprocess.run(step, capture_output=True, text=True, timeout=900)
                if done.returncode != 0:
                    pytest.skip(f"cannot install {CHECKOV} into {HERE}: {(done.stdout + done.stderr)[-500:]}")
            _DONE.write_text(CHECKOV + "\n")
    return _EXE


def scan(directory: pathlib.Path) -> list[dict]:
    """The failed checks of checkov's kubernetes framework over every manifest in ``directory``:
    one dict per finding with ``check_id``, ``check_name``, ``resource`` (checkov's
    ``Kind.namespace.name``) and ``file`` (relative to ``directory``)."""
    exe = install_checkov()
    # Offline: no guideline mapping or policy download from the vendor's platform.
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE"}
    out = subprocess.run([str(exe), "--directory", str(directory), "--framework", "kubernetes", "--output", "json",
                          "--quiet", "--compact", "--skip-download"], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode in (0, 1), f"checkov exited {out.returncode} (1: failed checks): {out.stderr[-2000:]}"
    report = json.loads(out.stdout)
    found = [r for r in (report if isinstance(report, list) else [report]) if r.get("check_type") == "kubernetes"]
    assert found, f"checkov found no Kubernetes object to check in {directory}: {report}"
    (k8s,) = found
    assert not k8s["summary"]["parsing_errors"], k8s["summary"]
    return [{"check_id": f["check_id"], "check_name": f["check_name"], "resource": f["resource"],
             "file": f["file_path"].lstrip("/")} for f in k8s["results"]["failed_checks"]]
