"""The process's entry: :func:`main` runs a command line (its errors one line on stderr, never a
traceback) and :func:`run`, the console script, ends the process without the interpreter's teardown."""
from __future__ import annotations

import atexit
import contextlib
import gc
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import NoReturn

from ..errors import ModelInitWarning
from .common import EXIT_BROKEN_PIPE, _fail
from .parser import build_parser


@contextlib.contextmanager
def _notes() -> Iterator[None]:
    """Each :class:`~modelinit.errors.ModelInitWarning` as one ``modelinit: note: ...`` line on
    stderr (a part with no shard to write, ...); other warnings as Python shows them."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, ModelInitWarning):
            print(f"modelinit: note: {' '.join(str(message).split())}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.simplefilter("always", ModelInitWarning)
        warnings.showwarning = show
        yield


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status: 0, 2 for bad input (arguments, spec,
    policy, a file given as --out), 1 for the environment (a server, the disk, a busy folder),
    130 for Ctrl-C, 141 when stdout's reader is gone. Errors are one line on stderr
    (``modelinit: error: ...``), never a traceback (``MODELINIT_DEBUG=1`` shows one for an
    unexpected error)."""
    try:
        with _notes():
            code = _main(argv)
        if sys.stdout is not None:
            sys.stdout.flush()  # a reader that went away shows here, not in the interpreter's last flush
        return code
    except BrokenPipeError:
        _drop_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except OSError as e:  # the environment: a file that cannot be read or written
        where = f"{e.filename}: " if e.filename else ""
        return _fail(f"{where}{e.strerror or e}", 1)
    except RecursionError:
        return _fail("input nested too deeply", 2)
    except Exception as e:
        if os.environ.get("MODELINIT_DEBUG"):
            raise
        text = " ".join(str(e).split())
        return _fail(f"unexpected {type(e).__name__}: {text[:300]} (a bug: please report it; MODELINIT_DEBUG=1 shows the traceback)", 1)


def _drop_stdout() -> None:
    """Point stdout at /dev/null: the interpreter flushes it once more at exit, which would
    fail on the closed pipe again (and print a traceback of its own)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real stdout (in-process, captured)
        pass


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


#: The cyclic garbage collector's thresholds in the console script's process (CPython's default is
#: (700, 10, 10)). Importing torch, transformers and a modeling module allocates hundreds of thousands
#: of long-lived objects, and at the default every 700 allocations start a collection that walks the
#: young ones, and every few hundred of those a full one that walks them all: in `modelinit probe` of
#: a tiny BERT (about 5 s, nearly all imports) about 1,000 collections took 0.75 s, six full ones
#: 0.55 s of it. At these thresholds: 33 collections, 0.27 s, none full, the same peak memory (the
#: objects are long-lived: a collection finds little). The CLI owns its process; the library never
#: changes this setting in a caller's.
GC_THRESHOLDS = (20_000, 20, 50)


def run() -> NoReturn:
    """The ``modelinit`` console script: :func:`main`, then the process ends without the
    interpreter's teardown. Once numba's kernels are loaded, tearing down its object graph (LLVM
    modules, type registries) takes 0.1-0.25 s of a 3.4 s job (tinyllama-1.1b on 2 cores), for
    nothing: the output is written, renamed and reported by then. What an exit must still do is
    done here: the exit handlers run (logging's flush among them) and stdout and stderr are
    flushed. With a non-daemon thread still alive the exit is the ordinary one, which waits for it.
    The garbage collector runs less often here (:data:`GC_THRESHOLDS` says why)."""
    gc.set_threshold(*GC_THRESHOLDS)
    code = main()
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a reader gone, a stream closed: nothing more to say there
            pass
    os._exit(code)
