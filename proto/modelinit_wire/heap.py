"""The C heap of a process that streams: keep megabyte blocks in the heap, on glibc.

A stream allocates and frees several 1 MiB blocks per message on each side (the chunk's bytes,
the protobuf field, the serialized message, gRPC's slices). glibc serves a block above its
mmap threshold (128 KiB at start) with a fresh ``mmap`` and returns it with ``munmap`` on
free, so every such block is page-faulted and zeroed anew: 256 faults per MiB. glibc raises
the threshold by itself only once a larger mapped block is freed, which in a server happens
when the first stream ends (its 8 MiB segments): measured, the first Init of a new server
took 9.3 s against 5.8 s for the next ones (tinyllama-1.1b, 2.15 M page faults against 2.6 k),
and a client process, new for every job, faulted ~1 GB of its 2.2 GB. Fixing the thresholds
at start makes the first stream as fast as the next ones and costs a few tens of MB of heap
kept for reuse. Only for processes modelinit owns (its CLI, ``modelinit serve``): a library
does not retune its caller's allocator.
"""
from __future__ import annotations

import os

#: Blocks up to this size come from the heap (glibc's own dynamic maximum is 32 MiB on 64-bit):
#: above the 8 MiB segments, staging buffers and messages a stream allocates.
MMAP_THRESHOLD = 16 << 20
#: Free memory kept at the heap's top before it is returned to the OS (the stream's working set
#: of blocks is a few of the above).
TRIM_THRESHOLD = 64 << 20

_M_TRIM_THRESHOLD = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD = -3


def keep_large_blocks() -> bool:
    """Set glibc's mmap and trim thresholds (MMAP_THRESHOLD, TRIM_THRESHOLD) unless the
    environment already chose them (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``).
    Returns whether both were set; False, doing nothing, off glibc (musl, macOS, Windows)."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return False
    except (ValueError, OSError, AttributeError):  # not glibc, or no confstr (Windows)
        return False
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
