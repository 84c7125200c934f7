"""Fan-out: one model's files produced or fetched in parallel, from several replicas or in-process.

The service is stateless and deterministic, so any replica can serve any file, from any byte.
Each file is one resumable stream of that file alone (:meth:`RemoteSource.events
<modelinit.remote.RemoteSource.events>`: on a lost server it moves on to the next replica from
the byte reached), written by the same writer as a single stream (``write``: the folder's
:func:`~modelinit.writer.write_files` or the bucket's :func:`~modelinit.bucket_writer.upload_files`). ``parallel`` files are in flight at once, file ``i``
starting on replica ``i mod n``; a replica serves only after it planned the same fingerprint
(one :class:`~modelinit.remote.Replicas` shared by the streams). The first file that fails
stops the others. :func:`each_file` is the same for any source: the embedded engine's ``parallel``
files are each their own producer and SHA-256 (hashing, one serial stream per file, is what bounds
a job whose generation is fast: a GPU node, many cores).
"""
from __future__ import annotations

import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Callable

from modelinit_wire.v1 import modelinit_pb2 as pb

from .manifest import FileResult
from .remote import RemoteSource, ResumingEvents
from .source import Events

#: Writes one stream's files (indices into the plan) and returns them checked: the sink.
Write = Callable[[Events, list[int], Callable[[int], None]], list[FileResult]]


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


def fetch(source: RemoteSource, request: pb.ModelRequest, plan: pb.PlanResponse, write: Write, parallel: int,
          progress: Callable[[int], None], files: list[int] | None = None) -> tuple[list[FileResult], dict[str, int]]:
    """Every file of ``plan`` (or those of ``files``, indices into it), each through ``write``, in
    that order; also how many files each target finished."""
    replicas = source.replicas(plan.fingerprint)
    served = {t: 0 for t in source.targets}

    def open_stream(i: int) -> ResumingEvents:
        return source.events(request, plan, [i], replicas=replicas, start=i)

    def count(i: int, stream: Events) -> None:
        assert isinstance(stream, ResumingEvents)  # open_stream's
        served[source.targets[stream.replica]] += 1

    indices = list(range(len(plan.files))) if files is None else files
    return each_file(open_stream, indices, write, parallel, progress, count), served
