"""The folder writer (:class:`FolderWriter`): what ``init_model`` does to a local folder one
process writes, file by file.

:func:`prepare` surveys the folder before writing (keeps a rerun's verified files, clears what an
earlier run recorded, refuses foreign files); :func:`write_files` writes a stream of events into
it, each file through a hidden temp file checked by :class:`~modelinit.stream.StreamCheck` and
renamed into place; :class:`FolderRecord` records each rename (``.modelinit.progress.json``);
:func:`atomic_write` writes a small file whole or not at all (the manifest, the record).
"""
from __future__ import annotations

import logging
import os
import pathlib
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable

import grpc
from modelinit_wire.events import Begin, Data
from modelinit_wire.v1 import modelinit_pb2 as pb

from ..errors import ModelInitError
from ..handoff import Events, FileResult
from ..manifest import (
    MANIFEST_FILE,
    PROGRESS_FILE,
    loader_file,
    manifest_bytes,
    progress_bytes,
    read_manifest,
    read_record,
    sha256_file,
)
from ..parts import Part
from ..stream import StreamCheck
from .direct_file import DirectFile
from .folder_lock import FolderLock
from .local_io import atomic_write, discard, os_error
from .protocol import Finalized, Survey

log = logging.getLogger("modelinit.client")  # the client's log, whichever module writes it


class FolderRecord:
    """This run's record (``PROGRESS_FILE``, what a rerun resumes from): rewritten atomically after each file is
    renamed into place (``add``, thread-safe: fan-out finishes several files at once)."""

    def __init__(self, out: pathlib.Path, plan: pb.PlanResponse, kept: dict[int, FileResult], stale: list[str],
                 fsync: bool) -> None:
        self.files = dict(kept)
        """Plan index -> a finished file of this run (or kept from an interrupted one)."""
        self._path, self._plan, self._stale, self._fsync = out / PROGRESS_FILE, plan, list(stale), fsync
        self._lock = threading.Lock()

    def save(self) -> None:
        with self._lock:
            self._save()

    def cleaned(self) -> None:
        """The stale files are gone: the next save no longer lists them."""
        with self._lock:
            self._stale = []

    def add(self, index: int, result: FileResult) -> None:
        with self._lock:
            self.files[index] = result
            self._save()

    def drop_if_empty(self) -> None:
        """Delete the record when it records nothing (no file finished, nothing left to delete)."""
        with self._lock:
            if not self.files and not self._stale:
                try:
                    self._path.unlink(missing_ok=True)
                except OSError as e:
                    log.warning("cannot remove %s: %s", self._path, e)

    def _save(self) -> None:
        files = [f for _, f in sorted(self.files.items())]
        atomic_write(self._path, progress_bytes(self._plan, files, self._stale), self._fsync)


def prepare(out: pathlib.Path, plan: pb.PlanResponse, overwrite: bool, fsync: bool) -> "tuple[FileResult, ...] | FolderRecord":
    """Survey ``out`` before writing ``plan`` into it, and clear what must go.

    Ours: the files that ``modelinit.json`` or a progress record lists, and hidden ``.*.partial``
    temp files. Of ours, the files of this plan (same fingerprint and algorithm version, name and
    size) whose SHA-256 still matches the record are kept; the rest is deleted. Foreign: a file
    no record lists that a loader would pick up (see :func:`~modelinit.manifest.loader_file`, or a name of this
    plan); refused (FAILED_PRECONDITION, before anything is touched) unless ``overwrite``, which
    deletes them. Returns the files, in plan order, when ``modelinit.json`` already describes exactly
    this plan and every file is kept; otherwise the new progress record (saved before the
    manifest and the stale files are deleted, so an interruption leaves them recorded)."""
    try:
        entries = {e.name: e for e in os.scandir(out)}
    except FileNotFoundError:
        entries = {}
    manifest = read_record(out / MANIFEST_FILE) if MANIFEST_FILE in entries else None
    progress = read_record(out / PROGRESS_FILE) if PROGRESS_FILE in entries else None
    records = [r for r in (manifest, progress) if r is not None]
    ours = {f.name for r in records for f in r.files} | {n for r in records for n in r.stale}
    planned = {f.name: i for i, f in enumerate(plan.files)}
    kept: dict[int, FileResult] = {}
    tried: set[FileResult] = set()
    for r in records:
        if r.fingerprint != plan.fingerprint or r.algorithm_version != plan.algorithm_version:
            continue
        for f in r.files:
            i = planned.get(f.name)
            if i is None or i in kept or f in tried or f.size != plan.files[i].size or f.name not in entries:
                continue
            tried.add(f)
            st = entries[f.name].stat(follow_symlinks=False)  # a link is not ours to trust
            if stat.S_ISREG(st.st_mode) and st.st_size == f.size and sha256_file(out / f.name) == f.sha256:
                kept[i] = f
    keep = {f.name for f in kept.values()}
    foreign = sorted(n for n in entries if n not in ours and not n.startswith(".") and n != MANIFEST_FILE
                     and (n in planned or loader_file(n)))
    if foreign and not overwrite:
        shown = ", ".join(foreign[:8]) + (f" and {len(foreign) - 8} more" if len(foreign) > 8 else "")
        raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION,
                             f"{out} holds {shown}, which no modelinit run recorded (in {MANIFEST_FILE}) and a loader "
                             f"would pick up beside the new weights; move them away, or pass --overwrite "
                             f"(overwrite=True) to delete them")
    stale = sorted((ours & entries.keys()) - keep) + foreign
    temps = sorted(n for n in entries if n.startswith(".") and n.endswith(".partial"))
    # A folder where a file of ours is deleted or written would fail the run half-way: refused first.
    blocked = sorted(n for n in {*planned, *stale, *temps, MANIFEST_FILE, PROGRESS_FILE} & entries.keys()
                     if entries[n].is_dir(follow_symlinks=False))
    if blocked:
        raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION,
                             f"{out / blocked[0]} is a folder where modelinit writes a file"
                             + (f" (and {len(blocked) - 1} more)" if len(blocked) > 1 else "")
                             + "; move it away and run again (nothing was changed)")
    complete = (manifest is not None and manifest.fingerprint == plan.fingerprint
                and manifest.algorithm_version == plan.algorithm_version and len(kept) == len(plan.files)
                and sorted(manifest.files, key=lambda f: f.name) == sorted(kept.values(), key=lambda f: f.name))
    if complete:
        try:
            read_manifest(out)  # and the rest of it well-formed (its request replays)
        except ModelInitError:
            complete = False
    if complete:
        for name in stale + temps:
            (out / name).unlink(missing_ok=True)
        (out / PROGRESS_FILE).unlink(missing_ok=True)
        return tuple(kept[i] for i in range(len(plan.files)))
    out.mkdir(parents=True, exist_ok=True)
    record = FolderRecord(out, plan, kept, stale, fsync)
    record.save()
    (out / MANIFEST_FILE).unlink(missing_ok=True)  # the folder is incomplete from here on
    for name in stale + temps:
        (out / name).unlink(missing_ok=True)
    record.cleaned()
    return record


def write_files(source: Events, plan: pb.PlanResponse, out: pathlib.Path, indices: Iterable[int],
                progress: Callable[[int], None], fsync: bool, direct_io: bool,
                on_written: Callable[[int, FileResult], None] | None = None, hash_here: bool = True) -> list[FileResult]:
    """Write the files ``indices`` (in that order) from ``source``'s events into ``out``: each to
    a hidden temp file (created exclusively, never through a link; ``O_DIRECT`` where allowed),
    hashed on a second thread while it is written (``hash_here``; False for an in-process producer,
    whose End digests are of these very buffers and are recorded as they are), checked
    (:class:`~modelinit.stream.StreamCheck`: order, names, the planned size, the producer's SHA-256),
    then renamed into place;
    ``on_written(index, result)`` follows each rename. A file is refused (DATA_LOSS) at the first
    byte past its planned size. Closes ``source``; an interrupted file is
    deleted; an OSError (disk full) is raised as ModelInitError."""
    check = StreamCheck(plan, indices, hashed=hash_here)
    current: tuple[pathlib.Path, DirectFile, str] | None = None  # (temp path, file object, name) of the file being written
    hasher = ThreadPoolExecutor(1, thread_name_prefix="modelinit-sha256") if hash_here else None
    try:
        for event in source:
            if isinstance(event, Data):
                n = check.data(event.data, event.checked)
                assert current is not None  # check.data refuses data outside a file (DATA_LOSS)
                # Hash on a second thread while this one writes: both release the GIL.
                hashed = hasher.submit(check.sha256.update, event.data) if hasher is not None and check.hashing else None
                try:
                    current[1].write(event.data)
                finally:
                    if hashed is not None:
                        hashed.result()
                progress(n)
            elif isinstance(event, Begin):
                check.begin(event)
                tmp = out / f".{event.name}.partial"
                tmp.unlink(missing_ok=True)  # a stale temp file (or a link planted there) goes, never written through
                current = (tmp, DirectFile(tmp, direct_io), event.name)
            else:
                index = check.index
                result = check.end(event)  # on a mismatch, the finally below deletes the temp file
                assert index is not None and current is not None  # check.end refuses an End outside a file
                tmp, fh, _ = current
                fh.close(fsync)
                current = None
                os.replace(tmp, out / result.name)
                if on_written is not None:
                    on_written(index, result)
    except OSError as e:
        raise os_error(e, out, current[2] if current is not None else None) from e
    finally:
        try:
            source.close()  # a no-op after a complete stream; otherwise the producer stops now
        finally:
            if hasher is not None:
                hasher.shutdown()
            if current is not None:  # interrupted mid-file: leave nothing half-written behind
                discard(current[1], current[0])
    return check.finish()


class FolderWriter:
    """A :class:`~modelinit.destinations.protocol.Destination` over a local folder that one process writes
    (one init per folder at a time: :class:`~modelinit.destinations.folder_lock.FolderLock`): this module's
    survey, temp files and renames, the manifest written last. ``hash_here``: hash what passes
    (False for an in-process producer)."""

    def __init__(self, out: pathlib.Path, *, fsync: bool, direct_io: bool, hash_here: bool = True) -> None:
        self.out = out
        self.where: pathlib.Path | str = out
        self.fsync, self.direct_io, self.hash_here = fsync, direct_io, hash_here
        self.lock = FolderLock(out)
        self.record: FolderRecord | None = None

    def prepare(self, plan: pb.PlanResponse, part: Part, overwrite: bool) -> Survey:
        if not part.whole:
            raise ValueError("FolderWriter writes whole checkpoints; parts go through bucket_writer.PrefixWriter")
        self.lock.acquire()  # a second init of this folder fails here, at once
        try:
            got = prepare(self.out, plan, overwrite, self.fsync)
        except OSError as e:
            raise os_error(e, self.out) from e
        if isinstance(got, tuple):
            return Survey(complete=got)
        self.record = got
        if got.files:
            log.info("%s: keeping %d file(s) an interrupted run finished (re-hashed)", self.out, len(got.files))
        return Survey(kept=dict(got.files))

    def write(self, events: Events, plan: pb.PlanResponse, indices: list[int],
              progress: Callable[[int], None]) -> list[FileResult]:
        if self.record is None:
            raise RuntimeError("FolderWriter.write before prepare")
        return write_files(events, plan, self.out, indices, progress, self.fsync, self.direct_io,
                           on_written=self.record.add, hash_here=self.hash_here)

    def finish(self, plan: pb.PlanResponse, part: Part, small: list[tuple[FileResult, bytes]]) -> Finalized:
        if self.record is None:
            raise RuntimeError("FolderWriter.finish before prepare")
        missing = [f.name for i, f in enumerate(plan.files) if i not in self.record.files]
        if missing:  # the stream wrote every file or raised: only a caller's mistake ends here
            return Finalized(None, [0], missing)
        ordered = [self.record.files[i] for i in range(len(plan.files))]
        try:
            atomic_write(self.out / MANIFEST_FILE, manifest_bytes(plan, ordered), self.fsync)
            (self.out / PROGRESS_FILE).unlink(missing_ok=True)  # complete: the manifest says it all
        except OSError as e:
            raise os_error(e, self.out) from e
        return Finalized(ordered, [], [])

    def close(self, failed: bool) -> None:
        try:
            if failed and self.record is not None:
                self.record.drop_if_empty()  # a failed run that finished nothing leaves nothing behind
        finally:
            self.lock.release()
