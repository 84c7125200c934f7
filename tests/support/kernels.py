"""numba's kernels compiled once per run, not once per process.

A fresh checkout has no numba cache: every process that reaches a kernel before one of them has
written the cache compiles all four itself (about 15 s of one core each), and a run starts many at
once (both workers' in-process servers and census, their ranks' fork servers, the first servers and
CLI processes the slow tests start). The run's own process (the xdist controller) takes an exclusive
lock on :data:`LOCK` before any worker exists and compiles them in a subprocess
(``engine.cpu.warmup``: the cache written next to the engine); each worker waits on that lock
before its first test (:func:`wait`) and then loads the kernels from the cache. With the cache
already there, the warm-up is a load (under a second) and nobody waits."""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading

from tests.support import REPO

#: Held by the controller while the kernels compile (git ignores it).
LOCK = REPO / "tests" / ".kernels.lock"
_held: list[int] = []


def warm_in_background() -> None:
    """Take :data:`LOCK` now, then compile (or load) the kernels in a subprocess and release it
    (a thread of the controller; a failure is left to the processes that need the kernels)."""
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    _held.append(fd)

    def run() -> None:
        try:
            subprocess.run([sys.executable, "-c", "from modelinit_server.engine import cpu\n"
                            "if cpu.available(): cpu.warmup()"], cwd=REPO, capture_output=True, timeout=600)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    threading.Thread(target=run, name="numba kernels", daemon=True).start()


def wait() -> None:
    """Wait until the controller's warm-up has released :data:`LOCK` (at once if none holds it)."""
    try:
        fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
