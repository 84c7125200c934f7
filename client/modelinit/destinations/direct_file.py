"""A write-only file that bypasses the page cache where the OS and filesystem allow it.

Weights are written once and not read back by this process, so copying them through the page
cache only costs time and memory: on Linux every page written buffered is first allocated and
zeroed in the cache, then written back later, and dirty pages count against a container's memory
limit. ``O_DIRECT`` sends the bytes from our buffer to the device instead. It needs the buffer's
address, the length and the file offset aligned to the device's logical block size, so data is
written straight from the caller's buffer when that buffer happens to be aligned (the embedded
engine's segments are) and through an aligned staging buffer otherwise; the final partial block is
padded and the file truncated to its real size. Where ``O_DIRECT`` is missing (macOS, Windows) or
refused (tmpfs, some FUSE and network filesystems), the file is written buffered: same bytes.

The file is created exclusively (``O_CREAT | O_EXCL | O_NOFOLLOW``): a file, or a symlink, already
at the path is an error (FileExistsError), never written through. The caller removes a stale file
of its own first (``unlink`` removes a symlink itself, not its target).
"""
from __future__ import annotations

import errno
import mmap
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # typing only: collections.abc.Buffer from Python 3.12
    from typing_extensions import Buffer

#: Alignment for O_DIRECT: a multiple of every common logical block size (512, 4096).
ALIGN = 4096
#: Staging buffer for unaligned input (gRPC messages), flushed in one write when full.
STAGE = 8 << 20

_O_DIRECT = getattr(os, "O_DIRECT", 0)
CREATE_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
           | getattr(os, "O_BINARY", 0))

try:
    import fcntl
except ImportError:  # Windows: no O_DIRECT either
    fcntl = None  # type: ignore[assignment]


class DirectFile:
    """Create ``path`` (it must not exist), ``write()`` bytes-like objects in order, then
    ``close()``; ``size`` is the bytes written. ``direct=False`` writes buffered. ``direct``
    tells which way the file is being written."""

    def __init__(self, path: str | os.PathLike, direct: bool = True) -> None:
        self.size = 0
        self._stage: mmap.mmap | None = None
        self._fill = 0  # bytes waiting in the staging buffer
        # Created buffered, then switched to O_DIRECT: opening with O_DIRECT on a filesystem that
        # refuses it may create the file before failing, and a second exclusive open would fail.
        self._fd = os.open(path, CREATE_FLAGS, 0o644)
        self.direct = False
        if direct and _O_DIRECT and fcntl is not None:
            try:
                fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) | _O_DIRECT)
                self.direct = True
            except OSError as e:
                if e.errno != errno.EINVAL:  # EINVAL: this filesystem does not do O_DIRECT
                    os.close(self._fd)
                    os.unlink(path)  # created by us a moment ago
                    raise

    def fileno(self) -> int:
        return self._fd

    def write(self, data: Buffer) -> None:
        # Every view is released on the way out, an error included: a view left to a traceback
        # would keep the staging buffer exported and make closing it fail (BufferError).
        with memoryview(data) as raw, raw.cast("B") as mv:
            n = len(mv)
            if n == 0:
                return
            if not self.direct:
                self._write_all(mv)
            elif self._fill == 0 and n % ALIGN == 0 and _aligned(mv):
                self._write_all(mv)  # zero copy: offset, length and address are all aligned
            else:
                self._staged(mv)
        self.size += n

    def _staged(self, mv: memoryview) -> None:
        if self._stage is None:
            self._stage = mmap.mmap(-1, STAGE)  # anonymous mappings are page-aligned
        with memoryview(self._stage) as stage:
            pos = 0
            while pos < len(mv):
                k = min(len(mv) - pos, len(stage) - self._fill)
                stage[self._fill : self._fill + k] = mv[pos : pos + k]
                self._fill += k
                pos += k
                if self._fill == len(stage):
                    self._write_all(stage)
                    self._fill = 0

    def _write_all(self, mv: memoryview) -> None:
        pos = 0
        while pos < len(mv):
            try:
                with mv[pos:] as rest:
                    pos += os.write(self._fd, rest)
            except OSError as e:
                if e.errno != errno.EINVAL or not self.direct:
                    raise
                self._go_buffered()  # refused after all (alignment rules stricter than ours)

    def _go_buffered(self) -> None:
        fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~_O_DIRECT)
        self.direct = False

    def close(self, fsync: bool = False) -> None:
        """Write what is staged (the last block padded, then truncated away), ``fsync`` if asked
        (O_DIRECT bypasses the cache, not the device's write cache or the metadata), and close."""
        if self._fd < 0:
            return
        try:
            if self._fill:
                assert self._stage is not None  # bytes are staged only in the staging buffer
                with memoryview(self._stage) as stage:
                    if self.direct:
                        padded = -(-self._fill // ALIGN) * ALIGN
                        stage[self._fill : padded] = bytes(padded - self._fill)
                        with stage[:padded] as block:
                            self._write_all(block)
                        os.ftruncate(self._fd, self.size)
                    else:
                        with stage[: self._fill] as block:
                            self._write_all(block)
                self._fill = 0
            if fsync:
                os.fsync(self._fd)
        finally:
            self._fill = 0
            fd, self._fd = self._fd, -1
            mapping, self._stage = self._stage, None
            try:
                os.close(fd)
            finally:
                if mapping is not None:
                    try:
                        mapping.close()
                    except BufferError:  # a caller still holds a view: the mapping goes with it
                        pass

    def abort(self) -> None:
        """Close without writing what is staged (the caller deletes the file)."""
        self._fill = 0
        self.close()

    def __enter__(self) -> "DirectFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _aligned(mv: memoryview) -> bool:
    """Whether the buffer's address is ALIGN-aligned (only a writable buffer exposes it cheaply)."""
    if mv.readonly:
        return False
    import ctypes

    return ctypes.addressof(ctypes.c_char.from_buffer(mv)) % ALIGN == 0
