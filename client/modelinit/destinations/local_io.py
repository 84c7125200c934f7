"""Writing files into a local folder safely: whole or not at all, and errors as one ModelInitError.

Shared by the folder writer (:mod:`modelinit.destinations.folder`) and the shared folder of ``--part`` runs
(:mod:`modelinit.destinations.local_prefix`).
"""
from __future__ import annotations

import errno
import logging
import os
import pathlib

import grpc

from ..errors import ModelInitError
from .direct_file import CREATE_FLAGS, DirectFile

log = logging.getLogger("modelinit.client")


def os_error(e: OSError, out: pathlib.Path, name: str | None = None) -> ModelInitError:
    """A failed write into ``out`` as a ModelInitError: RESOURCE_EXHAUSTED for a full disk or
    quota, PERMISSION_DENIED for a refused write, FAILED_PRECONDITION otherwise."""
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG):
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        code = grpc.StatusCode.PERMISSION_DENIED
    else:
        code = grpc.StatusCode.FAILED_PRECONDITION
    what = f"writing {name}" if name else (str(e.filename) if e.filename and str(e.filename) != str(out) else "")
    return ModelInitError(code, ": ".join(p for p in (str(out), what, e.strerror or str(e)) if p))


def discard(fh: DirectFile, tmp: pathlib.Path) -> None:
    """Close and delete an unfinished temp file; a failure to (a broken disk) is logged, not
    raised over the error that brought us here."""
    try:
        fh.abort()
    except OSError as e:
        log.warning("closing %s: %s", tmp, e)
    try:
        tmp.unlink(missing_ok=True)
    except OSError as e:
        log.warning("cannot remove the temp file %s: %s", tmp, e)


def atomic_write(path: pathlib.Path, data: bytes, fsync: bool) -> None:
    """``path`` whole or not at all: a hidden temp file (created exclusively, never through a
    link), renamed into place."""
    tmp = path.with_name(f".{path.name}.partial")
    tmp.unlink(missing_ok=True)
    try:
        with open(os.open(tmp, CREATE_FLAGS, 0o644), "wb") as fh:
            fh.write(data)
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
