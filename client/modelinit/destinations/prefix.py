"""The prefix writer (:class:`PrefixWriter`): what ``init_model`` does to an object-store prefix
(or, for ``--part``, a local folder the parts share, :mod:`modelinit.destinations.local_prefix`):
the object-store counterpart of :mod:`modelinit.destinations.folder`, written for many writers at once.

One run, or part K of N (:mod:`modelinit.parts`), goes:

1. :func:`prepare` surveys the prefix: the shards of this part that an earlier try uploaded and
   recorded (same fingerprint, same size, same e_tag: the very object it uploaded) are kept; the
   open multipart uploads a killed try left for this part's shards are aborted; objects an earlier
   run recorded but this plan does not write are deleted, and a ``modelinit.json`` of other weights
   goes first (the prefix is incomplete from then on); objects no run recorded that a loader would
   read are refused unless ``overwrite``. Another part's shards are never touched. A record
   listed and gone before it is read (the last part finalized meanwhile) means the prefix changed
   under the survey: it is listed again (:data:`SURVEYS`).
2. :func:`upload_files` uploads each shard as one multipart upload fed by the stream, checked on
   the way (:class:`~modelinit.stream.StreamCheck`): a check that fails aborts the upload, so no
   object ever holds wrong or partial bytes. After each shard the part's record
   (``.modelinit.part-K-of-N.json``; ``.modelinit.progress.json`` for a whole run) is rewritten.
3. :func:`finalize`: once every part's record lists its shards, present with their e_tags, the
   small files (index, config.json) and then ``modelinit.json`` are created exactly once, with a
   conditional create (S3 ``If-None-Match: *``) where the store has one; a part that loses the race
   finds the same bytes there. The records are deleted last (and by a part that finds the manifest
   already there: its own record may have landed after, or a finalization stopped before deleting
   them, its task then run again). ``modelinit finalize URL`` runs it alone.
"""
from __future__ import annotations

import hashlib
import json
import logging
import pathlib
import re
import threading
import time
from typing import Callable, Iterable, Iterator, Union

import grpc
from modelinit_wire.events import Begin, Data, End
from modelinit_wire.v1 import modelinit_pb2 as pb

from ..bucket import Bucket, e_tag_of
from ..errors import ModelInitError
from ..handoff import Events, FileResult
from ..manifest import (
    MANIFEST_FILE,
    MAX_RECORD_BYTES,
    PROGRESS_FILE,
    loader_file,
    manifest_bytes,
    parse_manifest,
    parse_record,
)
from ..parts import Part, part_files, small_files
from ..stream import StreamCheck
from .local_prefix import LocalPrefix
from .protocol import Finalized, Survey

log = logging.getLogger("modelinit.client")

#: What the protocol runs on: an object-store prefix, or a folder the parts of a checkpoint share.
Prefix = Union[Bucket, LocalPrefix]

#: How often :func:`prepare` lists the prefix while what it listed vanishes before it is read (a
#: finalization takes one listing more; a prefix that keeps changing is surveyed as last listed).
SURVEYS = 3

_PART_RECORD = re.compile(r"^\.modelinit\.part-(\d+)-of-(\d+)\.json$")


def record_name(part: Part) -> str:
    """The hidden object recording what ``part`` has uploaded."""
    return PROGRESS_FILE if part.whole else f".modelinit.part-{part.index:05d}-of-{part.count:05d}.json"


def _is_record(name: str) -> bool:
    return name == PROGRESS_FILE or _PART_RECORD.match(name) is not None


class PrefixRecord:
    """This part's record: the shards it finished, each with its SHA-256 and the e_tag of the
    object (a rerun keeps a shard whose object still has that e_tag). Rewritten whole after each
    shard (thread-safe)."""

    def __init__(self, bucket: Prefix, plan: pb.PlanResponse, part: Part, kept: dict[int, tuple[FileResult, str]]) -> None:
        self.bucket, self.plan, self.part = bucket, plan, part
        self.files: dict[int, tuple[FileResult, str]] = dict(kept)
        """Plan index -> (file, e_tag)."""
        self._lock = threading.Lock()
        self._request = json.loads(manifest_bytes(plan, []))["request"]

    def add(self, index: int, result: FileResult, e_tag: str) -> None:
        with self._lock:
            self.files[index] = (result, e_tag)
            self.save()

    def save(self) -> None:
        files = [f for _, (f, _) in sorted(self.files.items())]
        doc = {
            "fingerprint": self.plan.fingerprint,
            "algorithm_version": self.plan.algorithm_version,
            "request": self._request,  # what `modelinit finalize URL` replans the small files from
            "part": [self.part.index, self.part.count],
            "files": [{"name": f.name, "size": f.size, "sha256": f.sha256} for f in files],
            "e_tags": {f.name: t for _, (f, t) in sorted(self.files.items())},
            "stale": [],
        }
        self.bucket.put(record_name(self.part), (json.dumps(doc, indent=1) + "\n").encode())


def _record_of(data: bytes | None, plan: pb.PlanResponse) -> dict[str, tuple[FileResult, str]] | None:
    """A record's bytes, when they record ``plan``'s weights: file name -> (file, e_tag); None when
    missing, unreadable or of other weights."""
    record = parse_record(data) if data is not None else None
    if record is None or record.fingerprint != plan.fingerprint or record.algorithm_version != plan.algorithm_version:
        return None
    try:
        tags = json.loads(data).get("e_tags", {})  # type: ignore[arg-type]
    except (ValueError, AttributeError):
        tags = {}
    # Normalized: a record an earlier version saved holds the tags as the store sent them.
    return {f.name: (f, e_tag_of(tags[f.name])) for f in record.files if isinstance(tags.get(f.name), str)}


def _recorded_names(data: bytes | None) -> set[str]:
    """Every name a record's or manifest's bytes list (whatever its weights): ours to replace."""
    record = parse_record(data) if data is not None else None
    return set() if record is None else {f.name for f in record.files} | set(record.stale)


def _complete_manifest(bucket: Prefix, plan: pb.PlanResponse, objects: dict, data: bytes | None) -> list[FileResult] | None:
    """The files of a ``modelinit.json`` (its bytes: ``data``) that describes exactly this plan,
    every object there with its recorded size; None otherwise."""
    if MANIFEST_FILE not in objects or data is None:
        return None
    try:
        doc = parse_manifest(data or b"", f"{bucket}/{MANIFEST_FILE}")
    except ModelInitError:
        return None
    files = [FileResult(f["name"], f["size"], f["sha256"]) for f in doc["files"]]
    if (doc["fingerprint"] != plan.fingerprint or doc["algorithm_version"] != plan.algorithm_version
            or [(f.name, f.size) for f in files] != [(f.name, f.size) for f in plan.files]):
        return None
    if any(f.name not in objects or objects[f.name].size != f.size for f in files):
        return None
    return files


def sha256_object(bucket: Prefix, name: str) -> str:
    h = hashlib.sha256()
    for chunk in bucket.chunks(name):
        h.update(chunk)
    return h.hexdigest()


def prepare(bucket: Prefix, plan: pb.PlanResponse, part: Part, overwrite: bool) -> "list[FileResult] | PrefixRecord":
    """Survey the prefix for ``part`` of ``plan`` and clear what must go (the module's step 1).
    Returns the plan's files when the prefix is already complete with these weights (this part's
    objects re-hashed); otherwise this part's record (saved), holding the shards kept."""
    for _ in range(SURVEYS):
        objects = bucket.list()
        records = sorted(n for n in objects if _is_record(n))
        # Each record and the manifest read once (small objects; N parts mean N records).
        raw = {n: bucket.read(n, limit=MAX_RECORD_BYTES) for n in [*records, *([MANIFEST_FILE] if MANIFEST_FILE in objects else [])]}
        if None not in raw.values():
            break
        # Listed, then gone before it was read: the prefix changed under this survey (the last part
        # created modelinit.json and deleted the records; another run cleared a manifest). Read as it
        # was listed, config.json and the index would look like no run's: survey it again.
    mine = part_files(plan, part)
    planned = {f.name: i for i, f in enumerate(plan.files)}
    complete = _complete_manifest(bucket, plan, objects, raw.get(MANIFEST_FILE))
    if complete is not None and all(sha256_object(bucket, complete[i].name) == complete[i].sha256 for i in mine):
        # A finalization stopped between modelinit.json and the records' deletion (its worker lost, a
        # task run again after it): what is left of this split's records goes, as finalize does.
        _drop_records(bucket, objects, part.count)
        return complete

    of_plan = {n: _record_of(raw[n], plan) for n in records}
    own = of_plan.get(record_name(part))
    ours = set().union(*(_recorded_names(data) for data in raw.values()))
    finalizing = any(r is not None for r in of_plan.values())
    small_names = {plan.files[i].name for i in small_files(plan)}
    if finalizing:
        ours |= small_names  # a finalization of these weights may have begun: its small files are ours

    kept: dict[int, tuple[FileResult, str]] = {}
    for i in mine:
        name = plan.files[i].name
        got = objects.get(name)
        if own is None or got is None or name not in own:
            continue
        result, tag = own[name]
        if result.size == plan.files[i].size == got.size and tag == got.e_tag:
            kept[i] = (result, tag)

    others = {plan.files[i].name for i in range(len(plan.files)) if plan.files[i].shard} - {plan.files[i].name for i in mine}
    foreign = sorted(n for n in objects if not n.startswith(".") and n != MANIFEST_FILE and n not in ours
                     and n not in others and (n in planned or loader_file(n)))
    if foreign and not overwrite:
        shown = ", ".join(foreign[:8]) + (f" and {len(foreign) - 8} more" if len(foreign) > 8 else "")
        raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION,
                             f"{bucket} holds {shown}, which no modelinit run recorded (in {MANIFEST_FILE}) and a loader "
                             "would pick up beside the new weights; move them away, or pass --overwrite "
                             "(overwrite=True) to delete them")
    record = PrefixRecord(bucket, plan, part, kept)
    record.save()
    if MANIFEST_FILE in objects:
        bucket.delete(MANIFEST_FILE)  # the prefix is incomplete from here on
    stale = sorted(n for n in (ours & objects.keys()) if n not in planned and not _is_record(n) and n != MANIFEST_FILE) + \
        [n for n in foreign if n not in planned]
    if not finalizing:  # an earlier run's index and config.json go now, not at the conditional create
        stale += sorted(n for n in (ours & objects.keys() & small_names) if n not in stale)
    for name in stale:
        bucket.delete(name)
    for name in records:  # records of other weights (this part's own was just rewritten)
        if name != record_name(part) and of_plan[name] is None:
            bucket.delete(name)
    aborted = bucket.abort_pending(plan.files[i].name for i in mine if i not in kept)
    if aborted:
        log.info("%s: aborted %d multipart upload(s) an interrupted run left open", bucket, aborted)
    return record


def _file_chunks(events: Iterator, check: StreamCheck, first: Begin, progress: Callable[[int], None],
                 done: list[FileResult]) -> Iterator:
    """One file's bytes from the shared event iterator, checked as they pass; the file's checked
    result goes to ``done`` at its End (before the upload may complete). A failed check raises,
    and the multipart upload fed from here is aborted."""
    check.begin(first)
    for event in events:
        if isinstance(event, Data):
            n = check.data(event.data, event.checked)
            if check.hashing:
                check.sha256.update(event.data)
            progress(n)
            yield event.data
        elif isinstance(event, End):
            done.append(check.end(event))
            return
        else:
            check.begin(event)  # refuses a file beginning inside another (DATA_LOSS)
    raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"stream: {first.name} ended early")


def upload_files(bucket: Prefix, source: Events, plan: pb.PlanResponse, indices: Iterable[int],
                 progress: Callable[[int], None], on_written: Callable[[int, FileResult, str], None] | None = None,
                 hash_here: bool = True) -> list[FileResult]:
    """Upload the files ``indices`` (in that order) from ``source``'s events, each as one
    multipart upload (the module's step 2); ``on_written(index, result, e_tag)`` follows each.
    ``hash_here``: hash the bytes as they pass (False for an in-process producer, whose End
    digests are of these very buffers: see :class:`~modelinit.stream.StreamCheck`). Closes ``source``."""
    check = StreamCheck(plan, indices, hashed=hash_here)
    events = iter(source)
    try:
        for event in events:
            if not isinstance(event, Begin):
                raise ModelInitError(grpc.StatusCode.DATA_LOSS, "stream: data outside a file")
            done: list[FileResult] = []
            e_tag = bucket.upload(event.name, _file_chunks(events, check, event, progress, done))
            if not done:
                raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"stream: {event.name} ended early")
            if on_written is not None:
                on_written(event.index, done[0], e_tag)
    finally:
        source.close()
    return check.finish()


def _create_once(bucket: Prefix, name: str, data: bytes) -> bool:
    """``name`` created with ``data`` unless it already holds exactly that (another part won the
    race): True when this call wrote it. Where the store has no conditional create, the bytes are
    written plainly (every part writes the same ones), and the log says so."""
    for attempt in range(5):
        try:
            bucket.put(name, data, create=True)
            return True
        except FileExistsError:
            if bucket.read(name, limit=MAX_RECORD_BYTES) == data:
                return False
            if attempt < 4:  # or another writer's create is under way (412/409 before its object shows)
                time.sleep(0.2 * 2**attempt)
                continue
            log.info("%s: replacing %s of an earlier run", bucket, name)
        except ModelInitError as e:
            if "NotImplemented" not in e.details and "501" not in e.details:
                raise
            log.warning("%s: the store has no conditional create (If-None-Match); writing %s unconditionally", bucket, name)
        break
    bucket.put(name, data)
    return True


def _listed_manifest(bucket: Prefix, plan: pb.PlanResponse, objects: dict) -> list[FileResult] | None:
    """:func:`_complete_manifest` of the ``modelinit.json`` in ``objects`` (a listing), read."""
    return _complete_manifest(bucket, plan, objects, bucket.read(MANIFEST_FILE) if MANIFEST_FILE in objects else None)


def finalize(bucket: Prefix, plan: pb.PlanResponse, count: int, small: list[tuple[FileResult, bytes]]) -> Finalized:
    """If every one of ``count`` parts recorded its shards, and each is there as recorded: create
    the small files (``small``: the index and config.json with their bytes, checked; those a whole
    run uploaded with its shards are not needed) and then ``modelinit.json`` exactly once, delete
    the records; returns the plan's files. While a shard is missing: no files (nothing written),
    and what is missing."""
    objects = bucket.list()
    if (done := _listed_manifest(bucket, plan, objects)) is not None:
        _drop_records(bucket, objects, count)
        return Finalized(done, [], [])
    results: dict[int, FileResult] = {}
    missing: list[int] = []
    uploaded: dict[str, FileResult] = {}  # name -> a recorded file whose object is there as recorded
    for k in range(count):
        name = record_name(Part(k, count))
        record = _record_of(bucket.read(name, limit=MAX_RECORD_BYTES), plan) if name in objects else None
        for result, tag in (record or {}).values():
            got = objects.get(result.name)
            if got is not None and got.size == result.size and got.e_tag == tag:
                uploaded[result.name] = result
        shards = [i for i in part_files(plan, Part(k, count)) if plan.files[i].shard]
        if any(plan.files[i].name not in uploaded for i in shards):
            missing.append(k)
        results.update((i, uploaded[plan.files[i].name]) for i in shards if plan.files[i].name in uploaded)
    # The last part creates modelinit.json, then deletes the records: one that read the records in
    # between finds its own shards unrecorded although the checkpoint is complete.
    if missing and (done := _listed_manifest(bucket, plan, later := bucket.list())) is not None:
        _drop_records(bucket, later, count)
        return Finalized(done, [], [])
    if missing:
        log.info("%s: part(s) %s of %d not finished yet; the last part to finish writes %s", bucket,
                 ", ".join(map(str, missing[:16])) + (" ..." if len(missing) > 16 else ""), count, MANIFEST_FILE)
        return Finalized(None, missing, [f.name for f in plan.files if f.shard and f.name not in uploaded])
    needed = [i for i in small_files(plan) if plan.files[i].name not in uploaded]  # a whole run uploaded its own
    results.update((i, uploaded[plan.files[i].name]) for i in small_files(plan) if i not in needed)
    given = {result.name: (result, data) for result, data in small}
    for i in needed:
        if plan.files[i].name not in given:
            raise ModelInitError(grpc.StatusCode.INTERNAL, f"{bucket}: finalize needs {plan.files[i].name}, which was not given")
        result, data = given[plan.files[i].name]
        _create_once(bucket, result.name, data)
        results[i] = result
    ordered = [results[i] for i in range(len(plan.files))]
    _create_once(bucket, MANIFEST_FILE, manifest_bytes(plan, ordered))
    for name in bucket.list():
        if _is_record(name):
            bucket.delete(name)
    return Finalized(ordered, [], [])


def _drop_records(bucket: Prefix, objects: dict, count: int) -> None:
    """The records of this split left beside a complete ``modelinit.json`` of the plan: a part with no
    shard to write lists the prefix before the last writer's manifest and saves its record after that
    writer deleted the records (Ray tasks ran so), so the part that finds the checkpoint complete
    deletes what is left."""
    for k in range(count):
        name = record_name(Part(k, count))
        if name in objects:
            bucket.delete(name)


def recorded_request(bucket: Prefix) -> tuple[pb.ModelRequest, int]:
    """The request the part records under the prefix hold, and how many parts they split it
    into: what ``modelinit finalize URL`` needs. FAILED_PRECONDITION when there is no record, or
    records of different requests or splits."""
    from ..manifest import manifest_request

    found: dict[tuple[str, int], dict] = {}
    for name in sorted(bucket.list()):
        if not _is_record(name):
            continue
        data = bucket.read(name, limit=MAX_RECORD_BYTES)
        try:
            doc = json.loads(data or b"")
            part = doc.get("part", [0, 1])
            request = manifest_request(doc)
        except (ValueError, AttributeError, TypeError, RecursionError):  # not a record: damaged, or not ours
            continue
        count = part[1] if isinstance(part, list) and len(part) == 2 and isinstance(part[1], int) else 1
        found[(request.SerializeToString(deterministic=True).hex(), count)] = {"request": request, "count": count}
    if not found:
        raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION,
                             f"{bucket}: no part records (.modelinit.part-*.json): nothing to finalize (a finished "
                             f"checkpoint has {MANIFEST_FILE} instead; an empty prefix was never written)")
    if len(found) > 1:
        raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION,
                             f"{bucket}: part records of {len(found)} different requests or splits; rerun one of them "
                             "with --overwrite")
    (only,) = found.values()
    return only["request"], only["count"]


class PrefixWriter:
    """A :class:`~modelinit.destinations.protocol.Destination` over ``prefix`` (an object-store prefix, or
    a folder the ``--part`` runs of one checkpoint share): this module's survey, uploads and
    finalize. ``hash_here``: hash what passes (False for an in-process producer)."""

    def __init__(self, prefix: Prefix, hash_here: bool = True) -> None:
        self.prefix = prefix
        self.where: pathlib.Path | str = prefix.folder if isinstance(prefix, LocalPrefix) else prefix.url
        self.hash_here = hash_here
        self.record: PrefixRecord | None = None

    def prepare(self, plan: pb.PlanResponse, part: Part, overwrite: bool) -> Survey:
        got = prepare(self.prefix, plan, part, overwrite)
        if isinstance(got, list):
            return Survey(complete=tuple(got))
        self.record = got
        if got.files:
            log.info("%s: keeping %d shard(s) an interrupted run uploaded (same e_tag)", self.prefix, len(got.files))
        return Survey(kept={i: f for i, (f, _) in got.files.items()})

    def write(self, events: Events, plan: pb.PlanResponse, indices: list[int],
              progress: Callable[[int], None]) -> list[FileResult]:
        if self.record is None:
            raise RuntimeError("PrefixWriter.write before prepare")
        return upload_files(self.prefix, events, plan, indices, progress, self.record.add, self.hash_here)

    def finish(self, plan: pb.PlanResponse, part: Part, small: list[tuple[FileResult, bytes]]) -> Finalized:
        return finalize(self.prefix, plan, part.count, small)

    def close(self, failed: bool) -> None:
        pass  # a part's record stays: it is what a rerun resumes from
