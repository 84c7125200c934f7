"""Work done once per test run, whichever test process asks first: :func:`once`.

Under pytest-xdist each worker is a process of its own, so a module- or session-scoped fixture is
built again by every worker that runs one of its tests. What is too costly to build twice (the
census' outcomes) is built by :func:`once` into a folder that every worker of the run shares: the
first caller makes it under a file lock, a caller that comes while it is being made waits for it,
and later callers read it. Without xdist the folder is the run's own temporary base, so a run
never sees another run's folder.
"""
from __future__ import annotations

import fcntl
import os
import pathlib
import shutil
from typing import Callable

_DONE = ".done"


def run_folder(tmp_path_factory) -> pathlib.Path:
    """A folder of this run that every xdist worker of it shares (the parent of the workers' own
    temporary bases, which pytest numbers per run), or the run's base without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once(tmp_path_factory, key: str, make: Callable[[pathlib.Path], None]) -> pathlib.Path:
    """The folder ``key`` of this run, ``make(folder)`` called into it by the first caller only.

    A ``make`` that raises leaves no folder behind: the next caller makes it again (and fails the
    same way, in its own test)."""
    folder = run_folder(tmp_path_factory) / f"once-{key}"
    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / _DONE).is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            try:
                make(folder)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            (folder / _DONE).touch()
    return folder
