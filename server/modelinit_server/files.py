"""The bytes of a plan's files, produced on demand in bounded chunks.

A shard is its header followed by its tensors' data; any byte range is produced by generating
only the elements it covers, so memory stays bounded by the chunk size whatever the model's
size, and a resumed stream yields exactly the bytes of an uninterrupted one.
"""
from __future__ import annotations

import hashlib
from typing import Iterator

from .engine import DTYPE_ITEMSIZE, generate
from .planner import FilePlan, Plan

DEFAULT_CHUNK = 1 << 20


def read(plan: Plan, file: FilePlan, start: int, end: int) -> bytes:
    """Bytes [start, end) of ``file`` (0 <= start <= end <= file.size)."""
    if not file.shard:
        return file.content[start:end]
    out = []
    header = file.header
    if start < len(header):
        out.append(header[start:min(end, len(header))])
    itemsize = DTYPE_ITEMSIZE[plan.request.dtype]
    for i in file.tensors:
        t = plan.tensors[i]
        lo = len(header) + t.offset
        hi = lo + t.nbytes
        if hi <= start or lo >= end:
            continue
        # Generate the whole elements covering the range, then trim a partial first/last element.
        b0, b1 = max(start, lo) - lo, min(end, hi) - lo
        e0, e1 = b0 // itemsize, -(-b1 // itemsize)
        data = generate(t.sampler, t.key, e0, e1 - e0, plan.request.dtype)
        out.append(data[b0 - e0 * itemsize : b1 - e0 * itemsize])
    return b"".join(out)


def chunks(plan: Plan, file: FilePlan, offset: int = 0, chunk_size: int = DEFAULT_CHUNK) -> Iterator[bytes]:
    """The file's bytes from ``offset`` to its end, in chunks of at most ``chunk_size``."""
    for pos in range(offset, file.size, chunk_size):
        yield read(plan, file, pos, min(pos + chunk_size, file.size))


def sha256_prefix(plan: Plan, file: FilePlan, end: int, chunk_size: int = DEFAULT_CHUNK) -> "hashlib._Hash":
    """A SHA-256 object fed with bytes [0, end): a resumed stream still reports the whole file's hash."""
    h = hashlib.sha256()
    for pos in range(0, end, chunk_size):
        h.update(read(plan, file, pos, min(pos + chunk_size, end)))
    return h
