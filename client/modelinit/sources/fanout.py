"""Fan-out: a plan's files through one sink, several at once, each its own stream.

:func:`each_file` serves both sources' ``stream_files``: the embedded engine's files are each their
own producer and SHA-256 (hashing, one serial stream per file, is what bounds a job whose
generation is fast: a GPU node, many cores); a remote source's are each one resumable stream of
that file alone, spread over its replicas (:meth:`RemoteSource.stream_files
<modelinit.sources.remote.RemoteSource.stream_files>`). The sink is a destination's ``write``
(:class:`~modelinit.destinations.protocol.Destination`), the same as for a single stream. The first file
that fails stops the others.
"""
from __future__ import annotations

import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Callable

from ..handoff import Events, FileResult, Write


class _Stopped(Exception):
    """Another file failed first: this one was not started or was cut short."""


def each_file(open_stream: Callable[[int], Events], indices: list[int], write: Write, parallel: int,
              progress: Callable[[int], None], on_done: Callable[[int, Events], None] | None = None) -> list[FileResult]:
    """Files ``indices`` (in that order in the result), ``parallel`` at once, each through its own
    stream (``open_stream(i)``: that file alone) and ``write``; ``on_done(i, stream)`` after each
    (under the lock that also serializes ``progress``). The first file that fails, or an interrupt of
    this thread, stops the others: queued ones never start, running ones are cut (their partial files
    removed)."""
    stop = threading.Event()
    active: set[Events] = set()
    lock = threading.Lock()  # progress callbacks and on_done are shared by the workers

    def locked_progress(n: int) -> None:
        with lock:
            progress(n)

    def one(i: int) -> FileResult:
        if stop.is_set():
            raise _Stopped()
        stream = open_stream(i)
        with lock:
            active.add(stream)
            if stop.is_set():  # stopped while this one opened: cut it too
                stream.close()
        try:
            (result,) = write(stream, [i], locked_progress)
        finally:
            with lock:
                active.discard(stream)
        if on_done is not None:
            with lock:
                on_done(i, stream)
        return result

    pool = ThreadPoolExecutor(parallel, thread_name_prefix="modelinit-fetch")
    futures = [pool.submit(one, i) for i in indices]
    try:
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        first = next((f.exception() for f in done if f.exception() is not None), None)
        if first is not None:
            raise first
    except BaseException:  # a file failed, or Ctrl-C reached this thread: stop the others now
        stop.set()
        for f in futures:
            f.cancel()
        with lock:
            for stream in active:
                stream.close()
        raise
    finally:
        pool.shutdown(wait=True)  # the cut files' writers delete their partial files first
    return [f.result() for f in futures]
