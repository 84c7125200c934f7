"""The client: plan a model, stream its files into a folder, verify every byte.

:class:`Client` drives a :class:`~modelinit.sources.protocol.Source` (the embedded engine,
:class:`~modelinit.sources.embedded.EmbeddedSource`, or servers, :class:`~modelinit.sources.remote.RemoteSource`) into a
:class:`~modelinit.destinations.protocol.Destination` (a folder, :class:`~modelinit.destinations.folder.FolderWriter`, or a
prefix, :class:`~modelinit.destinations.prefix.PrefixWriter`), chosen in
:func:`modelinit.destinations.choose.open_destination`;
``modelinit.json`` is :mod:`modelinit.manifest`'s.
"""
from __future__ import annotations

import logging
import os
import pathlib
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import grpc
from modelinit_wire.v1 import modelinit_pb2 as pb

from .bucket import is_bucket_url
from .errors import ModelInitError, ModelInitWarning
from .handoff import FileResult
from .manifest import (  # noqa: F401 - MANIFEST_FILE, PROGRESS_FILE, check_file_name, loader_file: also the client's API
    MANIFEST_FILE,
    MAX_RECORD_BYTES,
    parse_manifest,
    PROGRESS_FILE,
    check_file_name,
    check_plan_names,
    loader_file,
    local_folder,
    manifest_bytes,
    manifest_request,
    plan_differences,
    read_manifest,
)
from .parts import Part, idle_note, parse_part, part_files
from .progress_bar import progress_bar
from .tensor_bytes import TENSOR_FORMATS, TensorBytes, as_format, slice_dims
from .request import PolicyArg, RequestOptions, Spec, model_policy, model_request, model_spec  # noqa: F401 - also the client's API
from .sources.embedded import EmbeddedSource
from .sources.protocol import Source, full_plan
from .sources.remote import RETRYABLE, RemoteSource, RetryPolicy, connect_failure, split_targets  # noqa: F401 - also the client's API

log = logging.getLogger("modelinit.client")


@dataclass(frozen=True)
class InitResult:
    """What ``init_model`` wrote."""

    path: "pathlib.Path | str"
    """The output folder, or the object-store URL written (``s3://bucket/prefix``)."""
    fingerprint: str
    """Identifies the weights (same fingerprint, same tensor bytes)."""
    files: tuple[FileResult, ...]
    """Every file written, with its verified SHA-256 (shards first)."""
    total_params: int
    total_bytes: int
    """Tensor bytes (index.json's total_size)."""
    algorithm_version: int
    reused: bool = False
    """True when the folder already held these exact files, verified, and nothing was written."""
    kept: tuple[str, ...] = ()
    """Files an interrupted run of the same weights had finished, re-hashed and kept (not fetched
    again)."""
    complete: bool = True
    """False only after a ``part`` that finished its own share and found other parts unfinished:
    its shards are in, ``files`` lists them, and the last part to finish (or ``modelinit
    finalize``) writes ``modelinit.json``. A whole run, or a part whose own shards are not all
    there, that cannot write ``modelinit.json`` raises instead."""
    missing_parts: tuple[int, ...] = ()
    """When not ``complete``: the parts (0-based) whose shards are not all there yet."""


class Client:
    """A modelinit client. ``Client("host:50051")`` or ``Client("dns:///svc:50051")`` talks to a
    server; ``Client()`` runs embedded: the server's own planner, engine and file producer
    in-process, without the gRPC hop (needs the ``server`` extra), writing the same bytes.
    ``device`` picks the embedded engine (``auto``, ``cpu``, ``cuda``, ``reference``).

    ``target`` may list several replicas, comma-separated (``"h1:50051,h2:50051"``); a
    ``dns:///`` name is balanced round-robin over the addresses it resolves to. ``init_model``
    then fetches shards in parallel across them (``parallel``).

    Remote options: ``tls`` (or any of ``ca``/``cert``/``key``: PEM paths of the CA that signed
    the server's certificate and this client's certificate and key for mutual TLS), ``token``
    (sent as ``authorization: Bearer ...``), ``timeout`` (seconds per call), ``retry`` (how a
    lost connection is retried; a stream resumes from the byte it had reached), ``rehash``
    (SHA-256 every received byte here too: each data message's CRC32C is checked on receipt
    either way, and a message that fails it is asked for again). A server that
    never answered and cannot be connected to (a wrong address), or a TLS handshake that fails
    on trust, raises ModelInitError (UNAVAILABLE, ``cannot reach HOST:PORT: ...``) at once.
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        timeout: float | None = None,
        device: str = "auto",
        tls: bool = False,
        ca: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        token: str | None = None,
        retry: RetryPolicy | None = None,
        rehash: bool = False,
    ) -> None:
        self.target = target
        self.targets: tuple[str, ...] = ()
        """Server targets (``target`` split at commas); empty when embedded."""
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.source: Source
        """What plans and streams: a :class:`~modelinit.sources.embedded.EmbeddedSource` when embedded, a
        :class:`~modelinit.sources.remote.RemoteSource` for servers."""
        if target is None:
            self.source = EmbeddedSource(device)
        else:
            self.source = RemoteSource(target, timeout=timeout, tls=tls, ca=ca, cert=cert, key=key, token=token,
                                       retry=self.retry, rehash=rehash)
            self.targets = self.source.targets
            self.target = self.targets[0]

    @property
    def last_served(self) -> dict[str, int]:
        """After an ``init_model`` through servers: how many files each target finished (empty
        for one stream, and embedded)."""
        return self.source.last_served

    def close(self) -> None:
        self.source.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def plan(
        self,
        spec: Spec,
        *,
        seed: int = 0,
        policy: PolicyArg = None,
        dtype: str | None = None,
        max_shard_size: str | int | None = None,
        algorithm_version: int | None = None,
        architecture: str | None = None,
        tensors: bool = False,
    ) -> pb.PlanResponse:
        """The manifest: totals, every file, the tensor groups (``explain``), the fingerprint;
        with ``tensors=True`` also every tensor with its rule, std and shard (``tensors``, fetched
        page by page: a model of any size, under gRPC's default message limit).
        ``algorithm_version``: None for the newest, 1 to reproduce version-1 weights;
        ``architecture``: a model class overriding the spec's (``"LlamaModel"``)."""
        options = RequestOptions(seed=seed, policy=policy, dtype=dtype, max_shard_size=max_shard_size,
                                 algorithm_version=algorithm_version, architecture=architecture)
        return full_plan(self.source, options.request(spec), tensors)

    def tensors(
        self,
        spec: Spec,
        *,
        seed: int,
        names: list[str] | tuple[str, ...] | None = None,
        slices: Mapping[str, Any] | None = None,
        policy: PolicyArg = None,
        dtype: str | None = None,
        algorithm_version: int | None = None,
        architecture: str | None = None,
        as_: str = "numpy",
    ) -> dict[str, Any]:
        """Chosen tensors, or n-d slices of them, without writing any file: ``{name: array}``,
        each equal, byte for byte, to the same elements of the files ``init_model`` writes for
        the same arguments. Only the selected elements are generated (``Tensors`` RPC).

        ``names``: on-disk names (``plan(..., tensors=True).tensors[].name``), whole tensors;
        ``slices``: ``{name: ((start, stop), ...)}`` with one pair per dimension (``slice(a, b)``
        or ``None`` for the whole dimension also work; stop ``None``: to the end; no negative
        indices). A name in ``slices`` is fetched sliced, whether or not it is in ``names``.
        Both None: every stored tensor (at most 4 GiB per call). ``as_``: ``"numpy"`` (bfloat16
        needs ``ml_dtypes``), ``"torch"`` (needs torch) or ``"bytes"`` (:class:`TensorBytes`).
        numpy and torch are imported only here. A bad name or range: INVALID_ARGUMENT naming it
        (``selections[i].dims[d].stop: ...``). A server lost mid-stream is ridden out like
        ``init_model`` does (the client's ``retry``): the call resumes at the byte reached."""
        if as_ not in TENSOR_FORMATS:
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, f"as_: must be one of {', '.join(TENSOR_FORMATS)}, got {as_!r}")
        model = RequestOptions(seed=seed, policy=policy, dtype=dtype, algorithm_version=algorithm_version,
                               architecture=architecture).request(spec)
        request = pb.TensorsRequest(request=model)
        wanted = list(dict.fromkeys([*(names or ()), *(slices or {})]))
        if (names is not None or slices is not None) and not wanted:
            return {}  # asked for nothing (empty selections would mean every tensor)
        for name in wanted:
            if not isinstance(name, str):
                raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, f"names: tensor names are strings, got {name!r}")
            sel = request.selections.add(name=name)
            if slices is not None and name in slices:
                sel.dims.extend(slice_dims(name, slices[name]))
        raw: dict[str, TensorBytes] = {}
        current: TensorBytes | None = None
        expected = 0

        def finish() -> None:
            if current is not None and len(current.data) != expected:
                raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"tensors: {len(current.data)} bytes of {expected} "
                                                                "received for a selection")

        for msg in self.source.tensors(request):
            if not isinstance(msg, memoryview) and msg.WhichOneof("event") == "begin":
                finish()
                b = msg.begin
                current, expected = TensorBytes(bytearray(), tuple(b.shape), b.dtype), b.nbytes
                raw[b.name] = current
                continue
            data = msg if isinstance(msg, memoryview) else msg.data  # a payload view, or a parsed message
            if current is not None and len(current.data) + len(data) <= expected:
                current.data.extend(data)
            else:
                raise ModelInitError(grpc.StatusCode.DATA_LOSS, "tensors: data outside a selection's announced bytes")
        finish()
        return {name: as_format(t, as_) for name, t in raw.items()}

    def init_model(
        self,
        spec: Spec,
        *,
        seed: int,
        out_dir: str | os.PathLike,
        policy: PolicyArg = None,
        dtype: str | None = None,
        max_shard_size: str | int | None = None,
        algorithm_version: int | None = None,
        architecture: str | None = None,
        progress: bool | Callable[[int], None] = False,
        fsync: bool = False,
        direct_io: bool = True,
        parallel: int | None = None,
        overwrite: bool = False,
        part: "str | tuple[int, int] | Part | None" = None,
    ) -> InitResult:
        """Write the model's files (HF layout) into ``out_dir``; returns what was written.

        ``out_dir`` is a local folder, a ``file://`` URL, or an object-store prefix
        (``s3://bucket/prefix``, ``gs://``, ``az://``; the ``cloud`` extra): each shard is then one
        multipart upload that appears only once complete, and ``modelinit.json`` is written last
        (docs/object_storage.md). ``part=(K, N)`` (or ``"K/N"``, 0-based) writes only part K's
        byte-balanced share of the shards, so N workers write one checkpoint; the part that finds
        all N done writes the index, config.json and ``modelinit.json`` (``complete``), once.

        Each file goes to a hidden temp file, is checked against the server's SHA-256 and only
        then renamed into place; ``modelinit.json`` is written last, so a folder that has it is
        complete. On failure nothing that looks complete is left behind. A folder that already holds
        exactly these files (same fingerprint, every SHA-256 checked) is left as it is
        (``reused=True``). A remote stream that loses its server is resumed from the last byte
        received (see ``retry``); the bytes are the same. ``fsync`` also flushes
        every file to stable storage before its rename (safe against power loss, at disk speed;
        without it a killed process is still safe, the page cache keeps what was written).
        ``parallel``: files fetched at once, spread over the replicas; each file resumes on the next
        replica if its server goes away (None: a quarter of this node's usable cores, at least 1:
        :meth:`~modelinit.sources.remote.RemoteSource.files_at_once`). Embedded, files produced at once, each with its own
        producer and SHA-256: one file's hash is one serial stream (about 1-2 GB/s), so where generation
        is fast (a GPU, many cores) several files in flight let the hashes use several cores; on a small
        CPU machine they only compete with the generation. None (the default) lets the engine choose
        for this machine (:meth:`~modelinit.sources.embedded.EmbeddedSource.files_at_once`: 1 on a small CPU
        machine, half the cores on a GPU node). ``algorithm_version`` (None: the
        newest) and ``architecture`` (a class overriding the spec's) as in :meth:`plan`;
        ``modelinit.json`` records both. ``progress`` callables are then
        called from several threads. ``direct_io`` writes shards with ``O_DIRECT`` where the OS and filesystem allow it (no
        page-cache copy: faster, and no dirty pages charged to a container); False writes buffered.

        The folder ends up holding nothing a loader could mistake for these weights. Files an
        earlier modelinit run recorded (in its ``modelinit.json`` or its hidden progress record)
        are replaced or deleted, as are modelinit's own leftover ``.*.partial`` temp files.
        Files no run recorded that a loader would pick up (``*.safetensors``, ``*.bin``, ``*.pt``,
        ``*.pth``, ``*.ckpt``, ``*.h5``, ``*.msgpack``, ``*.gguf``, ``*.index.json``,
        ``config.json``, or any name this model writes) are refused with FAILED_PRECONDITION
        naming them, before anything is touched; ``overwrite=True`` deletes them. Other files
        (tokenizer, README, subfolders) are left alone. A rerun after an interrupted run keeps
        the files that run had finished (recorded with their SHA-256 in ``.modelinit.progress.json``
        as each was renamed into place), once re-hashed, and fetches only the others
        (``kept``); a file cut off mid-way is fetched again from its first byte.
        Writing errors (a full disk, ENOSPC) are ModelInitError (RESOURCE_EXHAUSTED for a full
        disk or quota), the temp file removed.
        """
        if parallel is not None and (isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1):
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, f"parallel: must be None or an integer >= 1, got {parallel!r}")
        share = parse_part(part)
        from .destinations.choose import open_destination  # the writers load where something is written

        dest = open_destination(out_dir, share, fsync=fsync, direct_io=direct_io, hash_here=not self.source.in_process)
        request = RequestOptions(seed=seed, policy=policy, dtype=dtype, max_shard_size=max_shard_size,
                                 algorithm_version=algorithm_version, architecture=architecture).request(spec)
        plan = full_plan(self.source, request)
        check_plan_names(plan)  # before anything is written
        from .destinations.protocol import read_small_files

        failed = True
        try:
            survey = dest.prepare(plan, share, overwrite)
            if survey.complete is not None:  # already holds exactly these files, verified
                failed = False
                return InitResult(dest.where, plan.fingerprint, survey.complete, plan.total_params, plan.total_bytes,
                                  plan.algorithm_version, reused=True)
            mine = part_files(plan, share)
            if not share.whole and not any(plan.files[i].shard for i in mine):  # it would end with no word
                warnings.warn(f"part {share}: {idle_note(plan, share.count)}", ModelInitWarning, stacklevel=2)
            todo = [i for i in mine if i not in survey.kept]
            kept = tuple(plan.files[i].name for i in mine if i in survey.kept)
            bar = progress_bar(progress, sum(plan.files[i].size for i in todo))
            try:
                def write(events, indices, tick):
                    return dest.write(events, plan, indices, tick)

                written = self.source.stream_files(request, plan, todo, write, parallel, bar) if todo else []
            finally:
                bar(None)
            # A part hands the index and config.json to the one that finalizes; a whole run wrote them.
            small = [] if share.whole else read_small_files(plan, lambda files: self.source.events(request, plan, files))
            try:
                done = dest.finish(plan, share, small)
            except ModelInitError as e:  # the shards are in, the checkpoint is not: say both
                raise ModelInitError(e.code, f"{e.details}; {MANIFEST_FILE} is not written, so {dest.where} is not a complete "
                                             f"checkpoint (the written shards are kept: rerun, or `modelinit finalize {dest.where}`)") from None
            failed = False
        finally:
            dest.close(failed)
        if done.files is None:
            lost = [plan.files[i].name for i in mine if plan.files[i].name in done.missing_files]
            if share.whole or lost:  # only a part whose own share is in may end without the manifest
                raise _not_there_as_written(dest.where, share, lost)
            results = {**survey.kept, **dict(zip(todo, written))}
            return InitResult(dest.where, plan.fingerprint, tuple(results[i] for i in mine),
                              plan.total_params, plan.total_bytes, plan.algorithm_version, kept=kept, complete=False,
                              missing_parts=tuple(done.missing_parts))
        return InitResult(dest.where, plan.fingerprint, tuple(done.files), plan.total_params, plan.total_bytes,
                          plan.algorithm_version, kept=kept)

    def finalize(self, url: str | os.PathLike) -> InitResult:
        """Complete a checkpoint that parts wrote (``init_model(..., part=(K, N))``): when every
        part's shards are there as recorded, write the index, config.json and ``modelinit.json``
        (each created once), as the last part does itself; for schedulers that prefer a final
        step. The request comes from the parts' records and is planned again here (its
        fingerprint must match). ``complete`` is False while a part is missing (nothing written).
        A checkpoint its last part finished already (``modelinit.json`` there, the records gone)
        is returned as it is, ``reused`` (nothing written): a final step is then a no-op."""
        from .destinations.choose import open_prefix

        prefix = open_prefix(url, "url")
        from .destinations.prefix import PrefixWriter, recorded_request
        from .destinations.protocol import read_small_files

        try:
            request, count = recorded_request(prefix)
        except ModelInitError:
            recorded = prefix.read(MANIFEST_FILE, limit=MAX_RECORD_BYTES)
            if recorded is None:
                raise
            doc = parse_manifest(recorded, f"{PrefixWriter(prefix).where}/{MANIFEST_FILE}")
            return InitResult(PrefixWriter(prefix).where, doc["fingerprint"],
                              tuple(FileResult(f["name"], f["size"], f["sha256"]) for f in doc["files"]),
                              doc["total_params"], doc["total_bytes"], doc["algorithm_version"], reused=True)
        plan = full_plan(self.source, request)
        check_plan_names(plan)
        small = read_small_files(plan, lambda files: self.source.events(request, plan, files))
        writer = PrefixWriter(prefix)
        done = writer.finish(plan, Part(0, count), small)
        return InitResult(writer.where, plan.fingerprint, tuple(done.files or ()), plan.total_params, plan.total_bytes,
                          plan.algorithm_version, complete=done.files is not None, missing_parts=tuple(done.missing_parts))

    def init_model_from_manifest(self, manifest: str | os.PathLike, out_dir: str | os.PathLike, **options: Any) -> InitResult:
        """Reproduce a run byte for byte: write into ``out_dir`` what the request recorded in
        ``manifest`` (an output folder, or its ``modelinit.json``) makes: the same spec (preset or
        config), architecture, policy, seed, dtype, max_shard_size and algorithm version, so every
        file and the new ``modelinit.json`` equal the recorded ones. ``options`` are
        :meth:`init_model`'s (``progress``, ``fsync``, ``direct_io``, ``parallel``, ...).

        The recorded request is planned first; a plan that differs from the manifest
        (fingerprint, algorithm version, files: another server version, another transformers)
        is refused with FAILED_PRECONDITION before anything is written. Written files whose
        SHA-256 differs from the recorded one raise DATA_LOSS. A missing or malformed manifest is
        a bad argument: INVALID_ARGUMENT."""
        where = os.fspath(manifest) if is_bucket_url(manifest) else local_folder(manifest, "from_manifest")
        try:
            doc = read_manifest(where, "from_manifest")
        except ModelInitError as e:
            if e.code != grpc.StatusCode.FAILED_PRECONDITION:
                raise  # a malformed URL (INVALID_ARGUMENT, naming the field) or the store's error (UNAVAILABLE, ...)
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, f"from_manifest: {e.details}") from None
        request = manifest_request(doc)
        differences = plan_differences(doc, full_plan(self.source, request))
        if differences:
            raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"{manifest}: cannot reproduce the recorded run: " + "; ".join(differences))
        result = self.init_model(request.spec, seed=request.seed, out_dir=out_dir, policy=request.policy, dtype=request.dtype,
                                 max_shard_size=request.max_shard_size, algorithm_version=request.algorithm_version, **options)
        recorded = {f["name"]: f["sha256"] for f in doc["files"]}
        for f in result.files:
            if recorded.get(f.name) != f.sha256:
                raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"{f.name}: reproduced with SHA-256 {f.sha256}, "
                                                                f"{manifest} records {recorded.get(f.name)}")
        return result


def reproduce(manifest: str | os.PathLike, out_dir: str | os.PathLike, *, client: "Client | None" = None,
              **options: Any) -> InitResult:
    """``Client.init_model_from_manifest`` with ``client``, or an embedded one (closed after)."""
    if client is not None:
        return client.init_model_from_manifest(manifest, out_dir, **options)
    with Client() as own:
        return own.init_model_from_manifest(manifest, out_dir, **options)


def _not_there_as_written(where: "pathlib.Path | str", part: Part, lost: list[str]) -> ModelInitError:
    """The error of a run whose own shards are not all there when it finalizes (deleted or
    replaced since: another writer, a lifecycle rule): it must not end as if it had succeeded."""
    whose = "this run" if part.whole else f"part {part}"
    shown = ", ".join(lost[:4]) + (f" and {len(lost) - 4} more" if len(lost) > 4 else "")
    return ModelInitError(grpc.StatusCode.ABORTED,
                          f"{where}: {MANIFEST_FILE} not written: {len(lost)} shard(s) {whose} wrote are not there as "
                          f"written ({shown}; deleted or replaced since, by another writer?); the checkpoint is incomplete: "
                          "rerun the same command to write them again")
