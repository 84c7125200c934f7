"""The bytes of a plan's files, produced on demand in bounded segments.

A shard is its header followed by its tensors' data; any byte range is produced by generating
only the elements it covers, so memory stays bounded by the segment size whatever the model's
size, and a resumed stream yields exactly the bytes of an uninterrupted one.
"""
from __future__ import annotations

import hashlib
import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterator, Sequence

import numpy as np
from modelinit_wire.events import Begin, Data, End, Event

from ..core.planner import FilePlan, Plan
from ..engine import DTYPE_ITEMSIZE
from ..engine.backends import REFERENCE, Fill, FillBeside
from .digests import Digests

#: Bytes generated per step: large enough for the kernels to run at full speed, small enough
#: to bound memory (a stream holds at most a couple of segments).
SEGMENT = 8 << 20


def read_into(plan: Plan, file: FilePlan, start: int, out: np.ndarray, fill: Fill = REFERENCE.fill) -> None:
    """Write bytes [start, start + len(out)) of ``file`` into ``out`` (contiguous uint8)."""
    end = start + len(out)
    if not file.shard:
        out[:] = np.frombuffer(file.content, np.uint8, end - start, start)
        return
    header = file.header
    if start < len(header):
        n = min(end, len(header)) - start
        out[:n] = np.frombuffer(header, np.uint8, n, start)
    itemsize = DTYPE_ITEMSIZE[plan.request.dtype]
    for i in file.tensors:
        t = plan.tensors[i]
        lo = len(header) + t.offset
        hi = lo + t.nbytes
        if hi <= start or lo >= end:
            continue
        b0, b1 = max(start, lo) - lo, min(end, hi) - lo  # byte range within the tensor
        e0, e1 = b0 // itemsize, -(-b1 // itemsize)  # the elements covering it
        dst = out[lo + b0 - start : lo + b1 - start]
        if b0 % itemsize == 0 and b1 % itemsize == 0:
            fill(dst, t.sampler, t.key, e0, e1 - e0, plan.request.dtype)
        else:  # a range boundary inside an element (a resume offset): generate whole elements, trim
            tmp = np.empty((e1 - e0) * itemsize, np.uint8)
            fill(tmp, t.sampler, t.key, e0, e1 - e0, plan.request.dtype)
            dst[:] = tmp[b0 - e0 * itemsize : b1 - e0 * itemsize]


def read(plan: Plan, file: FilePlan, start: int, end: int, fill: Fill = REFERENCE.fill) -> bytes:
    """Bytes [start, end) of ``file``."""
    out = np.empty(end - start, np.uint8)
    read_into(plan, file, start, out, fill)
    return out.tobytes()


def events(
    plan: Plan,
    selected: Sequence[int],
    offset: int = 0,
    fill: Fill = REFERENCE.fill,
    segment: int = SEGMENT,
    digest: bool = True,
    ring: int = 0,
    alloc=None,
    fill_beside: FillBeside | None = None,
    digests: Digests | None = None,
) -> Iterator[Event]:
    """The files ``selected`` (indices into plan.files), the first from ``offset``: Begin, Data
    segments, End per file. With ``digest`` each End carries the whole file's SHA-256 (a resumed
    file's skipped prefix is regenerated for it, not sent): each segment is hashed on a helper
    thread while the next one is generated, and that generation uses ``fill_beside`` (the backend's
    fill that leaves cores to other work; None: ``fill``) in pieces of :data:`SUBSEGMENT` bytes,
    leaving a core to each hash running in this process (:data:`HASHES`: every stream's, so files in
    flight together share the cores), then ``fill`` for the rest of the range at once.

    ``ring`` > 0 reuses that many segment buffers in turn (no allocation and page faults per
    segment): a Data's buffer is then valid only until ``ring - 1`` more events have been taken
    (a segment's hash ends before its buffer comes round again). 0 gives every segment a fresh
    buffer. ``alloc(n)`` makes the ring's buffers (the backend's: pinned memory for CUDA); default
    page-aligned host memory.

    ``digests``: the shards' SHA-256s this process already knows (:mod:`.digests`). A known
    shard's End carries the remembered digest and nothing of it is hashed, nor regenerated
    before ``offset``; every shard hashed whole here is remembered."""
    buffers = [(alloc or _page_aligned)(segment) for _ in range(ring)]
    hasher = ThreadPoolExecutor(1, thread_name_prefix="modelinit-sha256") if digest else None
    pending: list[Future] = []  # the hash in flight (at most one: a file's updates run in order)

    def settle() -> None:
        if pending:
            pending.pop().result()

    generate = fill if fill_beside is None else _switching(fill, fill_beside, HASHES)
    produced = 0
    try:
        for n, index in enumerate(selected):
            f = plan.files[index]
            off = offset if n == 0 else 0
            yield Begin(index, f.name, f.size, off)
            key, known = None, None  # a shard's key in ``digests``, and its digest when known
            if digest and digests is not None and f.shard:
                key = Digests.key(plan.fingerprint, plan.algorithm_version, f.header)
                known = digests.get(key)
            h = hashlib.sha256() if digest and known is None else None
            pos = 0 if h is not None else off
            while pos < f.size:
                # Segment boundaries stay on the absolute grid, so tensor data stays element-aligned.
                end = min((pos // segment + 1) * segment, f.size)
                buf = buffers[produced % ring][: end - pos] if ring else np.empty(end - pos, np.uint8)
                produced += 1
                read_into(plan, f, pos, buf, generate)
                if h is not None and hasher is not None:
                    settle()  # the previous segment's update, overlapped with this one's generation
                    pending.append(HASHES.submit(hasher, h.update, buf))
                if end > off:
                    yield Data(buf[max(off - pos, 0) :])
                pos = end
            settle()
            if h is not None:
                known = h.hexdigest()
                if digests is not None and key is not None:
                    digests.put(key, known)
            yield End(index, known)
    finally:
        if hasher is not None:
            hasher.shutdown()  # waits for an update in flight: its buffer is not released under it


#: Piece of ``fill_beside`` while a hash runs: a hash that ends mid-segment gives its core back to
#: the generation within this many bytes. Small, because that core idles meanwhile (2 MiB on one core
#: of two: ~2.6 ms, 8% of the job). Cheap there: leaving one core of two, a piece runs on the calling
#: thread (no thread-pool launch); with more cores the single hash thread sets the pace anyway.
SUBSEGMENT = 512 << 10


class Hashes:
    """The SHA-256 updates submitted in this process and not yet finished (``hashes()``), whatever
    stream they belong to: a generation beside them leaves them that many cores. Counted from
    submission, so a generation that starts right after its segment's hash was submitted leaves
    that hash its core even before the hash thread has picked it up."""

    def __init__(self) -> None:
        self._n = 0
        self._lock = threading.Lock()

    def __call__(self) -> int:
        return self._n

    def _add(self, k: int) -> None:
        with self._lock:
            self._n += k

    def submit(self, pool: ThreadPoolExecutor, update, data) -> Future:
        """``pool.submit(update, data)``, counted until it ends."""
        def counted() -> None:
            try:
                update(data)
            finally:
                self._add(-1)

        self._add(1)
        try:
            return pool.submit(counted)
        except BaseException:
            self._add(-1)
            raise


#: Every stream's hashes in this process (the server's concurrent streams, the embedded job's files in flight).
HASHES = Hashes()


def _switching(fill: Fill, fill_beside: FillBeside, running) -> Fill:
    """A fill by ``fill_beside`` in pieces of at most :data:`SUBSEGMENT` bytes while ``running()``
    (the number of hashes in flight, the cores to leave them) is not 0, then by one ``fill`` of the
    rest of the range, on every core (one launch, not one per piece: each parallel launch wakes the
    pool's threads). The bytes do not depend on how a range is cut."""

    def fill_in_pieces(out: np.ndarray, sampler, key: tuple[int, int], start: int, count: int, dtype: str) -> None:
        itemsize = DTYPE_ITEMSIZE[dtype]
        step = max(1, SUBSEGMENT // itemsize)
        s = 0
        while s < count:
            leave = running()
            if not leave:  # the rest at once, on every core
                fill(out[s * itemsize :], sampler, key, start + s, count - s, dtype)
                return
            c = min(step, count - s)
            fill_beside(out[s * itemsize : (s + c) * itemsize], sampler, key, start + s, c, dtype, leave)
            s += c

    return fill_in_pieces


def _page_aligned(n: int, align: int = 4096) -> np.ndarray:
    """An uninitialised uint8 buffer whose address is page-aligned, so that a writer using
    O_DIRECT can write it without a copy (segments also start on aligned file offsets)."""
    raw = np.empty(n + align, np.uint8)
    skip = -raw.ctypes.data % align
    return raw[skip : skip + n]


class Closed(RuntimeError):
    """The stream was closed (by another thread) while its consumer waited for the next event."""


class Prefetch:
    """Runs an iterator on a background thread, ``depth`` items ahead (bounded memory), so that
    producing item k+1 overlaps consuming item k. ``close()``, from any thread, stops the producer
    promptly (the source's own cleanup runs then) and a consumer waiting for an item gets
    :class:`Closed`."""

    _DONE = object()

    def __init__(self, source: Iterator, depth: int = 2) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(source,), name="modelinit-prefetch", daemon=True)
        self._thread.start()

    def _run(self, source: Iterator) -> None:
        try:
            for item in source:
                if not self._put((True, item)):
                    return
            self._put((True, self._DONE))
        except BaseException as e:  # handed to the consumer, raised there
            self._put((False, e))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()  # a generator's finally (its hash thread) runs now, not at garbage collection

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            try:
                ok, item = self._queue.get(timeout=0.1)
                break
            except queue.Empty:
                if self._stop.is_set():
                    raise Closed("the stream was closed") from None
        if not ok:
            raise item
        if item is self._DONE:
            raise StopIteration
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
