"""The installs some tests make on first use (checkov into tests/.scanner, torchtitan and mup into
tests/.stacks, Azurite and Prometheus' checkers from npm), started in the background when a run
begins, so that they overlap the first tests instead of keeping a worker waiting at their lock.

The run's own process (the xdist controller, or the one process with ``-n 0``) starts, once it
knows which tests were collected, one subprocess per install those tests need
(``python -m tests.support.installs NAME``); each takes the install's own file lock, as the tests
do, so a test that gets there first simply waits for it. :func:`finish` waits for them at the end
of the run, so that none is cut short. An install that cannot be made here (no package index, no
npm) is left to the test, which skips or fails with the reason as before.
"""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
import threading
from typing import Iterable

from tests.support import REPO


#: Each install: the function of tests/support that makes it (module, name), and the test paths
#: (prefixes of their node ids) that need it.
INSTALLS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "checkov": ("tests.support.scanner", "install_checkov", ("tests/project/test_scan.py",)),
    "torchtitan": ("tests.support.stacks", "install_torchtitan_files",
                   ("tests/server/training/test_torchtitan", "tests/server/training/test_stacks_cuda.py",
                    "tests/project/test_benchmarks.py", "tests/project/test_docs_run.py")),
    "megatron-newest": ("tests.support.stacks", "install_newest_megatron", ("tests/server/training/test_megatron_releases.py",)),
    "mup": ("tests.support.stacks", "install_mup",
            ("tests/server/core/test_literature_presets.py", "tests/server/probe/test_coord_check.py")),
    "azurite": ("tests.support.azure_server", "install_azurite", ("tests/client/",)),
    "prometheus": ("tests.support.prometheus", "install_checker", ("tests/project/test_monitoring.py",)),
}


def needs_install(nodeid: str) -> bool:
    return any(nodeid.startswith(p) for _, _, prefixes in INSTALLS.values() for p in prefixes)


_started: list[threading.Thread] = []


def start(nodeids: Iterable[str]) -> None:
    """Starts, in the background, every install that one of ``nodeids`` needs (once per run)."""
    if _started:
        return
    ids = list(nodeids)
    for name, (_, _, prefixes) in INSTALLS.items():
        if any(i.startswith(p) for i in ids for p in prefixes):
            thread = threading.Thread(target=_run, args=(name,), name=f"install {name}", daemon=True)
            thread.start()
            _started.append(thread)


def _run(name: str) -> None:
    subprocess.run([sys.executable, "-m", "tests.support.installs", name], cwd=REPO, capture_output=True,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))})


def finish() -> None:
    """Waits for the installs started by :func:`start`."""
    for thread in _started:
        thread.join()


def main(name: str) -> int:
    module, function, _ = INSTALLS[name]
    try:
        getattr(importlib.import_module(module), function)()
    except BaseException as e:  # noqa: BLE001 - pytest.skip's exception too: the test reports it
        print(f"{name}: {e!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
