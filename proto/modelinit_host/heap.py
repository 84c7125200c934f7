"""The C heap of a process that streams: keep megabyte blocks in the heap, on glibc.

A stream allocates and frees megabyte blocks for every message on each side (the server's
encoded message and gRPC's slices; the client's received message). glibc serves a block above
its mmap threshold (128 KiB at start) with a fresh ``mmap`` and returns it with ``munmap`` on
free, so every such block is page-faulted and zeroed anew (256 faults per MiB). glibc adapts by
itself: when a mapped block is freed it raises the mmap threshold to that block's size and the
trim threshold (free memory kept at the heap's top) to twice it, up to 32 MiB on 64-bit. But a
stream's blocks alone teach it too little: with a few of them in flight, twice one block is
not enough room and the heap is grown and trimmed again and again. Measured on tinyllama-1.1b
(2.2 GB) through a server: a new server's first Init took 9.3 s against 5.8 s for the next ones
(2.15 M page faults against 2.6 k: the next ones ran after the first stream had freed its 8 MiB
segments), and a client, library or CLI, faulted ~600 k times (5.6-5.9 s against 4.5-4.6 s).

:func:`keep_large_blocks` allocates and frees one :data:`BLOCK` at start: glibc's own
adaptation, triggered at once and with room (thresholds 16 and 32 MiB). Nothing is configured
(``mallopt`` is not called: glibc goes on adapting, and ``MALLOC_MMAP_THRESHOLD_`` or
``MALLOC_TRIM_THRESHOLD_`` in the environment, which turn the adaptation off, still decide), so
a library may do it in its caller's process: it is what the caller's own next large free would do.
"""
from __future__ import annotations

import os

#: The block allocated and freed: above the 8 MiB segments and staging buffers and the 1-3 MiB
#: messages a stream allocates, below glibc's 32 MiB cap on the adaptation.
BLOCK = 16 << 20

_done = False


def keep_large_blocks() -> bool:
    """Teach glibc's allocator to keep blocks up to :data:`BLOCK` in the heap (once per process).
    Returns whether it was done now; False off glibc (musl, macOS, Windows) and on a repeat call."""
    global _done
    if _done:
        return False
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return False
    except (ValueError, OSError, AttributeError):  # not glibc, or no confstr (Windows)
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        malloc, free = libc.malloc, libc.free
    except (OSError, AttributeError):
        return False
    malloc.restype, malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
    free.restype, free.argtypes = None, (ctypes.c_void_p,)
    block = malloc(BLOCK)
    if not block:
        return False
    free(block)  # glibc: mmap threshold := BLOCK, trim threshold := 2 * BLOCK
    _done = True
    return True
