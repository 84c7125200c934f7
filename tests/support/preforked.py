"""Python programs run as a fresh ``python SCRIPT ARGS`` runs them, each in a process forked from a
server that imported torch, transformers and their heavy dependencies once: :class:`Preforked`.

For the docs run (tests/project/test_docs_run.py) and the benchmarks' smoke runs
(tests/project/test_benchmarks.py): the docs' blocks start about 25 Python processes (python blocks,
``modelinit`` calls, ``python benchmarks/...``) and the benchmarks a dozen, and each paid those
imports again, about 3-4 CPU-seconds of a block's 5-10 on the 2-core machine.

What a program gets, as from a fresh interpreter: a process of its own (forked), the caller's
stdin, stdout and stderr (their descriptors passed over a Unix socket), working directory and
environment, ``sys.argv``, ``sys.path`` (the script's folder, then ``PYTHONPATH``'s entries, then
the interpreter's own), the script run as ``__main__``; and at its end what an interpreter's exit
does: non-daemon threads joined, ``atexit`` handlers run, the main module's objects released
(their finalizers run: a file left open is flushed), stdout and stderr flushed, the status of
``SystemExit`` (0 for ``None``, 1 with the message for a string) or 1 with the traceback for an
uncaught exception. A caller killed (a timeout) takes its program with it.

What differs, on purpose: only :data:`PRELOAD`'s third-party modules are imported ahead, never the
project's own, so an import of modelinit that works only after another module (a missing import)
still fails here as in a fresh process. A variable those modules read when imported (torch's and
transformers' own settings) has the server's value; the docs' blocks set none. ``TMPDIR`` is read
again (``tempfile``'s cached folder is reset in each program).

The shims (:attr:`Preforked.shims`): a folder of executables, ``modelinit`` (the console script)
and ``python``/``python3`` (``python SCRIPT ARGS``), that ask the server to run the program and exit
with its status. Any other form (``python -c``, ``-m``, an option) and a server that cannot be
reached run the real interpreter instead.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
from typing import Iterator

import pytest

#: Imported by the server before it forks anything: third-party modules only (see the docstring).
PRELOAD = ("torch", "torch.distributed", "numpy", "safetensors", "transformers", "transformers.modeling_utils",
           "numba", "grpc", "google.protobuf", "matplotlib", "rich")

_SHIM = '''\
#!{python} -IS
# A shim of tests/support/preforked.py: {what} in a process forked from its server.
import os, socket, struct, sys
REAL, SERVER, SCRIPT = {real!r}, {server!r}, {script!r}
args = sys.argv[1:]
if SCRIPT is None:  # python SCRIPT ARGS; anything else is the real interpreter's
    if not args or args[0].startswith("-"):
        os.execv(REAL, [REAL, *args])
    script, args = args[0], args[1:]
else:
    script = SCRIPT
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(SERVER)
    socket.send_fds(s, [b"F"], [0, 1, 2])
except OSError:
    os.execv(REAL, [REAL, script, *args])
import json
body = json.dumps({{"argv": [script, *args], "cwd": os.getcwd(), "env": dict(os.environ)}}).encode()
s.sendall(struct.pack("!I", len(body)) + body)
got = b""
while len(got) < 4:
    chunk = s.recv(4 - len(got))
    if not chunk:
        sys.exit("preforked: the server closed the connection before the program's status")
    got += chunk
code = struct.unpack("!i", got)[0]
os._exit(code if code >= 0 else 128 - code)
'''


class Preforked:
    """The server (a process of its own, stopped with :meth:`stop` or when its parent exits) and
    its shims."""

    def __init__(self, preload: tuple[str, ...] = PRELOAD) -> None:
        self.folder = pathlib.Path(tempfile.mkdtemp(prefix="preforked-"))
        self.socket = str(self.folder / "server.sock")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # each program's own is applied in it
        repo = str(pathlib.Path(__file__).resolve().parents[2])
        with open(self.folder / "server.log", "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", "import sys; from tests.support.preforked import serve; serve(*sys.argv[1:])",
                 self.socket, ",".join(preload)], cwd=repo, env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=log)
        shims = self.folder / "bin"
        shims.mkdir()
        console = shutil.which("modelinit", path=str(pathlib.Path(sys.executable).parent))
        for name, script, what in (("modelinit", console, "the modelinit console script"),
                                   ("python", None, "python SCRIPT ARGS"), ("python3", None, "python SCRIPT ARGS")):
            if name == "modelinit" and console is None:
                continue
            path = shims / name
            path.write_text(_SHIM.format(python=sys.executable, what=what, real=sys.executable, server=self.socket,
                                         script=script))
            path.chmod(0o755)
        self.shims = shims

    def ready(self, timeout: float = 120.0) -> bool:
        """Whether the server listens (its imports done) within ``timeout`` seconds; until it
        does, the shims run the real interpreter."""
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            if os.path.exists(self.socket):
                return True
            time.sleep(0.05)
        return os.path.exists(self.socket)

    def run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """``subprocess.run([python, *argv], **kwargs)``, the program forked from the server."""
        return subprocess.run([str(self.shims / "python"), *argv], **kwargs)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture(scope="session")
def preforked() -> Iterator[Preforked]:
    """This test process's server (started on first use, stopped at its end), ready or given up
    on after two minutes (the shims then run the real interpreter)."""
    server = Preforked()
    server.ready()
    yield server
    server.stop()


def serve(path: str, preload: str) -> None:
    """The server: the modules of ``preload`` (comma-separated) imported, then one forked program
    per connection on the Unix socket ``path``, until its parent exits or it is terminated."""
    import gc
    import importlib
    import warnings

    parent = os.getppid()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in filter(None, preload.split(",")):
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001, S112 - a program that needs it imports it, and fails there
                continue
    base = sys.path[1:]  # the interpreter's own entries (the first is -c's folder)
    gc.collect()
    gc.freeze()  # the preloaded objects: never scanned again by a program's collections, pages shared
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    server.settimeout(1.0)
    while os.getppid() == parent:
        _reap()
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        conn.settimeout(None)
        try:
            _, fds, _, _ = socket.recv_fds(conn, 1, 3)
            (size,) = struct.unpack("!I", _exact(conn, 4))
            request = json.loads(_exact(conn, size))
        except (OSError, ValueError, struct.error):
            conn.close()
            continue
        if os.fork() == 0:
            server.close()
            _supervise(conn, fds, request, base)
        conn.close()
        for fd in fds:
            os.close(fd)


def _exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise OSError("connection closed")
        data += chunk
    return data


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _supervise(conn: socket.socket, fds: list[int], request: dict, base: list[str]) -> None:
    """The forked child of the server: forks the program, sends its exit status to the shim, or
    kills it when the shim is gone (its caller's timeout killed it)."""
    import select
    import signal

    pid = os.fork()
    if pid == 0:
        conn.close()
        _program(fds, request, base)
    for fd in fds:
        os.close(fd)
    try:
        watched, wait = [conn, os.pidfd_open(pid)], None  # readable when the program ends
    except (AttributeError, OSError):  # a kernel before 5.3: ask every 50 ms
        watched, wait = [conn], 0.05
    while True:
        ready, _, _ = select.select(watched, [], [], wait)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            try:
                conn.sendall(struct.pack("!i", os.waitstatus_to_exitcode(status)))
            except OSError:
                pass
            os._exit(0)
        if conn in ready and not conn.recv(1):  # the shim is gone
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os._exit(0)


def _program(fds: list[int], request: dict, base: list[str]) -> None:
    """The program, in the process forked for it; never returns."""
    import atexit
    import builtins
    import gc
    import threading
    import traceback
    import types

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # read from TMPDIR again, as a fresh interpreter does (a preload may have asked)
    argv = request["argv"]
    script = os.path.abspath(argv[0])  # as a fresh interpreter's __main__.__file__ and tracebacks name it
    sys.argv = list(argv)
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.path.dirname(os.path.realpath(script)), *extra, *base]
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=script, __builtins__=builtins, __cached__=None)
    sys.modules["__main__"] = main
    code = 0
    try:
        with open(script, "rb") as f:
            source = f.read()
        exec(compile(source, script, "exec"), main.__dict__)
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException as e:  # noqa: BLE001 - as the interpreter does: the traceback (from the script's frame), 1
        traceback.print_exception(type(e), e, e.__traceback__.tb_next if e.__traceback__ else None)
        code = 1
    threading._shutdown()  # what an interpreter's exit does, in its order
    atexit._run_exitfuncs()
    main.__dict__.clear()  # the program's objects released: their finalizers run (an open file is flushed)
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
