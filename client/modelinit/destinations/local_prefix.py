"""A local folder shared by the ``--part K/N`` runs of one checkpoint, behind the object store's interface.

Several processes write one folder at once: each its share of the shards, and the last one the
index, config.json and ``modelinit.json``. :mod:`modelinit.destinations.prefix` runs that protocol (part
records, e_tags, an exactly-once finalize) on any prefix; :class:`LocalPrefix` gives it a folder
with the methods of :class:`~modelinit.bucket.Bucket`, written the way the folder writer writes
one process's files:

* a shard goes to a hidden temp file with ``O_DIRECT`` where the filesystem allows it
  (:class:`~modelinit.destinations.direct_file.DirectFile`: no page-cache copy) and is renamed into place
  complete, so a file appears only whole; a killed process leaves only its temp file, which the
  next run of that part deletes (:meth:`LocalPrefix.abort_pending`);
* an e_tag is the file's identity (inode, modification time in ns, size): a file replaced by
  anyone gets a new one, so a part's record matches only the very file it wrote;
* a create-once (``put(create=True)``) writes a temp file and links it into place: ``link(2)``
  fails when the name exists, so exactly one writer creates it, whole.

OS errors become one ModelInitError naming the folder (:func:`~modelinit.destinations.local_io.os_error`).
"""
from __future__ import annotations

import errno
import os
import pathlib
from typing import Any, Iterable, Iterator

import grpc

from ..bucket import ObjectInfo
from ..errors import ModelInitError
from ..manifest import read_small_file
from .direct_file import DirectFile
from .local_io import atomic_write, discard, os_error

#: Bytes per read when a file is streamed back (verify, a rerun's re-hash).
READ_BYTES = 8 << 20


class LocalPrefix:
    """A folder as a flat prefix of objects (its regular files; subfolders are not listed)."""

    scheme = "file"

    def __init__(self, folder: str | os.PathLike, field: str = "out_dir", *, direct_io: bool = True, fsync: bool = False) -> None:
        self.folder = pathlib.Path(folder)
        self.url = str(self.folder)
        """How results and messages name it: the folder as given."""
        self.field = field
        self.direct_io, self.fsync = direct_io, fsync

    def __str__(self) -> str:
        return self.url

    def _path(self, name: str) -> pathlib.Path:
        return self.folder / name

    @staticmethod
    def _tag(st: os.stat_result) -> str:
        return f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"

    def list(self) -> dict[str, ObjectInfo]:
        """The regular files directly in the folder, by name (links and subfolders left out)."""
        out: dict[str, ObjectInfo] = {}
        try:
            with os.scandir(self.folder) as entries:
                for e in entries:
                    try:
                        if not e.is_file(follow_symlinks=False):
                            continue
                        st = e.stat(follow_symlinks=False)
                    except FileNotFoundError:  # deleted while listed
                        continue
                    out[e.name] = ObjectInfo(e.name, st.st_size, self._tag(st))
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise os_error(e, self.folder) from e
        return out

    def read(self, name: str, limit: int | None = None) -> bytes | None:
        """The whole file (records, the manifest), None when it is not there. ``limit``: a larger
        file (or one that is not a regular file) is refused unread (FAILED_PRECONDITION)."""
        try:
            if limit is None:
                return self._path(name).read_bytes()
            return read_small_file(self._path(name), limit)
        except FileNotFoundError:
            return None
        except OSError as e:  # a folder, a link loop, a file too large: damaged, or not modelinit's
            code = grpc.StatusCode.PERMISSION_DENIED if e.errno in (errno.EACCES, errno.EPERM) else grpc.StatusCode.FAILED_PRECONDITION
            raise ModelInitError(code, f"{self._path(name)}: cannot read it: {e.strerror or e}") from None

    def chunks(self, name: str) -> Iterator[memoryview]:
        try:
            with open(self._path(name), "rb", buffering=0) as fh:
                while block := fh.read(READ_BYTES):
                    yield memoryview(block)
        except OSError as e:
            raise os_error(e, self.folder, name) from e

    def _made(self) -> None:
        """The folder exists (made on the first write, so a request refused while planning leaves none)."""
        self.folder.mkdir(parents=True, exist_ok=True)

    def _temp(self, name: str) -> pathlib.Path:
        # One per writer: several processes may create the same name at once.
        return self._path(f".{name}.{os.urandom(6).hex()}.partial")

    def put(self, name: str, data: bytes, create: bool = False) -> str:
        """A small file written whole; ``create``: only if no file has the name (FileExistsError
        otherwise). Its e_tag."""
        path = self._path(name)
        try:
            self._made()
            if not create:
                atomic_write(path, data, self.fsync)
            else:
                tmp = self._temp(name)
                try:
                    atomic_write(tmp, data, self.fsync)
                    try:
                        os.link(tmp, path)  # fails when the name exists: exactly one creator
                    except FileExistsError:
                        raise FileExistsError(name) from None
                finally:
                    tmp.unlink(missing_ok=True)
            return self._tag(os.stat(path, follow_symlinks=False))
        except FileExistsError:
            raise
        except OSError as e:
            raise os_error(e, self.folder, name) from e

    def upload(self, name: str, chunks: Iterable[Any]) -> str:
        """A shard from ``chunks`` (buffers, in order), renamed into place complete; when ``chunks``
        raises, the temp file is deleted and the error re-raised. Its e_tag."""
        tmp = self._path(f".{name}.partial")
        fh: DirectFile | None = None
        try:
            self._made()
            tmp.unlink(missing_ok=True)  # a stale temp file (or a link planted there) goes, never written through
            fh = DirectFile(tmp, self.direct_io)
            for chunk in chunks:
                fh.write(chunk)
            fh.close(self.fsync)
            fh = None
            os.replace(tmp, self._path(name))
            return self._tag(os.stat(self._path(name), follow_symlinks=False))
        except OSError as e:
            raise os_error(e, self.folder, name) from e
        finally:
            if fh is not None:  # interrupted mid-file: nothing half-written stays
                discard(fh, tmp)

    def delete(self, name: str) -> None:
        try:
            self._path(name).unlink(missing_ok=True)
        except OSError as e:
            raise os_error(e, self.folder, name) from e

    def abort_pending(self, names: Iterable[str]) -> int:
        """Delete the temp files a killed run left for ``names``. How many there were."""
        removed = 0
        for name in names:
            try:
                self._path(f".{name}.partial").unlink()
                removed += 1
            except FileNotFoundError:
                pass
            except OSError as e:
                raise os_error(e, self.folder, name) from e
        return removed
