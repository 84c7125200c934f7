"""numba's kernels compiled once per run, not once per process.

A fresh checkout has no numba cache: every process that reaches a kernel before one of them has
written the cache compiles all four itself (about 15 s of one core each), and a run starts many at
once (both workers' in-process servers and census, their ranks' fork servers, the first servers and
CLI processes the slow tests start). The run's own process (the xdist controller) takes an exclusive
lock on :data:`LOCK` before any worker exists and compiles them in a subprocess
(``engine.cpu.warmup``: the cache written next to the engine); each worker waits on that lock
before its first test (:func:`wait`) and then loads the kernels from the cache. With the cache
already there, the warm-up is a load (under a second) and nobody waits.

A warm-up that compiled (a fresh checkout: CI) also keeps each kernel's assembly, which only a
compile has (code loaded from the cache has none), in a folder of this run (:func:`compiled_asm`):
the machine-code tests read it instead of compiling each kernel again (about 6 s apiece)."""
from __future__ import annotations

import atexit
import fcntl
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading

from tests.support import REPO

#: Held by the controller while the kernels compile (git ignores it).
LOCK = REPO / "tests" / ".kernels.lock"
#: The environment variable naming this run's folder of compiled kernels' assembly (the workers inherit it).
ASM_ENV = "MODELINIT_TESTS_KERNEL_ASM"
_held: list[int] = []

#: The warm-up: compile or load every kernel; where it compiled, each kernel's assembly to ``argv[1]``.
_WARM = """
import pathlib, sys
from modelinit_server.engine import cpu
if cpu.available():
    cpu.warmup()
    for name in ("_kernel_ser", "_kernel_par", "_kernel_runs_ser", "_kernel_runs_par"):
        kernel = getattr(cpu, name)
        if sum(kernel.stats.cache_misses.values()):  # compiled here: the assembly exists
            (asm,) = kernel.inspect_asm().values()
            pathlib.Path(sys.argv[1], name + ".s").write_text(asm)
"""


def warm_in_background() -> None:
    """Take :data:`LOCK` now, then compile (or load) the kernels in a subprocess and release it
    (a thread of the controller; a failure is left to the processes that need the kernels)."""
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    _held.append(fd)
    asm = tempfile.mkdtemp(prefix="modelinit-kernel-asm-")
    os.environ[ASM_ENV] = asm  # before any worker exists: they inherit it
    atexit.register(shutil.rmtree, asm, True)

    def run() -> None:
        try:
            subprocess.run([sys.executable, "-c", _WARM, asm], cwd=REPO, capture_output=True, timeout=600)
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


def compiled_asm(name: str) -> str | None:
    """The assembly of kernel ``name`` as this run's warm-up compiled it, or None (it loaded the
    kernels from the cache, or there was no warm-up: ``-n 0``)."""
    folder = os.environ.get(ASM_ENV)
    if not folder:
        return None
    wait()
    path = pathlib.Path(folder, name + ".s")
    return path.read_text() if path.is_file() else None
