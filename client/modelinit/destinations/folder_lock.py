"""One ``init`` per output folder at a time: an exclusive lock file inside the folder.

Two processes (or threads) writing the same folder would rename their files over each other's
and leave a manifest that describes neither run. The writer holds ``flock(LOCK_EX)`` on
``.modelinit.lock`` in the folder for the whole run; a second writer fails at once, naming the
holder's process id. The lock goes with the process (the kernel drops it when the process ends,
however it ends), and a finished run deletes the file. Where the filesystem has no ``flock``
(or the OS has no ``fcntl``), the folder is written unlocked, as before.
"""
from __future__ import annotations

import errno
import logging
import os
import pathlib

import grpc

from ..errors import ModelInitError

LOCK_FILE = ".modelinit.lock"

log = logging.getLogger("modelinit.client")


class FolderLock:
    """``acquire()`` creates the folder (and its parents) and locks it; ``release()`` (safe to
    call in any state, any number of times) deletes the lock file and unlocks. Also a context
    manager. ModelInitError ABORTED when another writer holds the folder; OSError when the
    folder or the lock file cannot be created."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = pathlib.Path(folder)
        self.path = self.folder / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> "FolderLock":
        try:
            import fcntl
        except ImportError:  # no flock on this OS
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = _read_pid(fd)
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    by = f" (process {holder})" if holder else ""
                    raise ModelInitError(
                        grpc.StatusCode.ABORTED,
                        f"out: another modelinit init is writing into {self.folder}{by}; wait for it to finish "
                        f"or choose another folder (lock file {LOCK_FILE})",
                    ) from None
                log.warning("%s: cannot lock %s (%s); writing without a lock", self.folder, LOCK_FILE, e.strerror)
                return self  # e.g. ENOLCK, EOPNOTSUPP: a filesystem without flock
            # The previous holder deletes the file when it is done: if the file we locked is no
            # longer the one at the path, lock again (else two writers could each hold a lock).
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        self._fd = fd
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError:
            pass  # the pid is only shown to a second writer
        return self

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # while still locked: see acquire
        except OSError:
            pass
        os.close(fd)  # drops the flock

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
