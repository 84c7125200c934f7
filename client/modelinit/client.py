"""The client: plan a model, stream its files into a folder, verify every byte."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import random
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Union

import grpc
from google.protobuf import json_format

from . import policy_file
from .direct_file import DirectFile
from .errors import ModelInitError
from .events import Begin, Data, End
from .v1 import modelinit_pb2 as pb
from .v1 import modelinit_pb2_grpc as pb_grpc

MANIFEST_FILE = "modelinit.json"
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 16 << 20)]
#: Status codes after which a call is retried (and a stream resumed): the server went away or
#: could not be reached. Everything else is an answer and is raised.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE})
#: Tensors per Plan page when a caller wants them all (the server allows up to 10,000; 5,000
#: TensorPlans are ~1 MB).
PLAN_PAGE_SIZE = 5000

log = logging.getLogger("modelinit.client")


@dataclass(frozen=True)
class RetryPolicy:
    """How a remote client rides out a lost connection (a restarted or drained server)."""

    deadline: float = 120.0
    """Seconds to keep trying after a failure before giving up; progress (bytes received)
    starts the count again. 0 disables retries."""
    initial_backoff: float = 0.25
    """Seconds before the first retry."""
    max_backoff: float = 5.0
    """Longest wait between retries."""
    multiplier: float = 2.0
    """Growth of the wait after each failed try (each wait is jittered to 50-100%)."""

    def __post_init__(self) -> None:
        if self.deadline < 0:
            raise ValueError(f"deadline: must be >= 0 seconds, got {self.deadline!r}")
        if not 0 < self.initial_backoff <= self.max_backoff:
            raise ValueError(f"initial_backoff: must be > 0 and <= max_backoff, got {self.initial_backoff!r}")
        if self.multiplier < 1:
            raise ValueError(f"multiplier: must be >= 1, got {self.multiplier!r}")


class _Backoff:
    """Waits between tries until the policy's deadline, counted from the first failure since the
    last ``progress()``."""

    def __init__(self, policy: RetryPolicy) -> None:
        self._policy = policy
        self.progress()

    def progress(self) -> None:
        self._since: float | None = None
        self._wait = self._policy.initial_backoff

    def wait_or_raise(self, error: ModelInitError) -> None:
        now = time.monotonic()
        if self._since is None:
            self._since = now
        left = self._since + self._policy.deadline - now
        if error.code not in RETRYABLE or left <= 0:
            raise error
        pause = min(self._wait * random.uniform(0.5, 1.0), left)
        log.warning("%s; retrying in %.2fs (giving up in %.0fs)", error, pause, left)
        time.sleep(pause)
        self._wait = min(self._wait * self._policy.multiplier, self._policy.max_backoff)

Spec = Union[str, os.PathLike, Mapping[str, Any], pb.ModelSpec]
PolicyArg = Union[str, os.PathLike, Mapping[str, Any], None, pb.Policy]


@dataclass(frozen=True)
class FileResult:
    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class InitResult:
    """What ``init_model`` wrote."""

    path: pathlib.Path
    """The output folder."""
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


def model_spec(spec: Spec) -> pb.ModelSpec:
    """A preset name, a path to a config.json (or a folder holding one), or a config dict."""
    if isinstance(spec, pb.ModelSpec):
        return spec
    if isinstance(spec, Mapping):
        return pb.ModelSpec(config_json=json.dumps(dict(spec)))
    path = pathlib.Path(spec)
    if isinstance(spec, os.PathLike) or path.suffix == ".json" or path.exists():
        if path.is_dir():
            path = path / "config.json"
        try:
            return pb.ModelSpec(config_json=path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, f"spec: cannot read config file {str(path)!r}: {e}") from None
    return pb.ModelSpec(preset=str(spec))


def model_policy(policy: PolicyArg) -> pb.Policy:
    """None (hf-default), a preset name, a path to a JSON/YAML policy file, a policy dict, or the message."""
    if isinstance(policy, pb.Policy):
        return policy
    try:
        if policy is None:
            return pb.Policy()
        if isinstance(policy, Mapping):
            return policy_file.from_dict(policy)
        if isinstance(policy, os.PathLike) or policy_file.looks_like_file(policy) or os.path.isfile(policy):
            return policy_file.load(policy)
    except ValueError as e:
        raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
    return pb.Policy(preset=policy)


def model_request(
    spec: Spec,
    *,
    seed: int,
    policy: PolicyArg = None,
    dtype: str | None = None,
    max_shard_size: str | int | None = None,
    algorithm_version: int | None = None,
    architecture: str | None = None,
) -> pb.ModelRequest:
    """The request message. ``algorithm_version`` None (or 0) asks for the server's newest;
    ``architecture`` (a model class name, e.g. ``"BertModel"``) overrides the spec's class."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, f"seed: must be an integer in [0, 2^64), got {seed!r}")
    if algorithm_version is not None and (
        isinstance(algorithm_version, bool) or not isinstance(algorithm_version, int) or not 0 <= algorithm_version < 2**32
    ):
        raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"algorithm_version: must be a version number (1, 2; 0 or None: the newest), got {algorithm_version!r}")
    if architecture is not None and not isinstance(architecture, str):
        raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, f"architecture: must be a class name, got {architecture!r}")
    msg = pb.ModelRequest(
        spec=model_spec(spec),
        policy=model_policy(policy),
        seed=seed,
        dtype=dtype or "",
        max_shard_size="" if max_shard_size is None else str(max_shard_size),
        algorithm_version=algorithm_version or 0,
    )
    if architecture:
        msg.spec.architecture = architecture
    return msg


def check_file_name(name: str) -> str:
    """Refuse any server-supplied name that could write outside the output folder."""
    if not name or name in (".", "..") or name.startswith(".") or any(c in name for c in "/\\\0:") or os.path.isabs(name):
        raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"server sent an unsafe file name {name!r}; refusing to write it")
    return name


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
    lost connection is retried; a stream resumes from the byte it had reached).
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
    ) -> None:
        self._local = None
        self._channels: list = []
        self.target = target
        self.targets: tuple[str, ...] = ()
        """Server targets (``target`` split at commas); empty when embedded."""
        self.last_served: dict[str, int] = {}
        """After a fanned-out ``init_model``: how many files each target finished."""
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        if target is None:
            try:
                from modelinit_server.local import LocalEngine
            except ImportError as e:
                raise ModelInitError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"embedded mode needs the server extra ({e}); pip install 'modelinit[server]' or pass a server target",
                ) from None
            try:
                self._local = LocalEngine(device)
            except ValueError as e:
                raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        else:
            from .credentials import make_channel

            self.targets = split_targets(target)
            self.target = self.targets[0]
            try:
                self._channels = [make_channel(t, tls=tls, ca=ca, cert=cert, key=key, token=token, options=_channel_options(t))
                                  for t in self.targets]
            except ValueError as e:
                raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
            self._stubs = [pb_grpc.ModelInitStub(ch) for ch in self._channels]
            self._stub = self._stubs[0]

    def close(self) -> None:
        for ch in self._channels:
            ch.close()

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
        request = model_request(spec, seed=seed, policy=policy, dtype=dtype, max_shard_size=max_shard_size,
                                algorithm_version=algorithm_version, architecture=architecture)
        return self._plan(request, tensors=tensors)

    def _plan(self, request: pb.ModelRequest, tensors: bool = False) -> pb.PlanResponse:
        """The summary (no tensors listed), or with ``tensors`` every page merged into one
        response (``next_page_token`` empty)."""
        if not tensors:
            return self._plan_page(request)
        plan = self._plan_page(request, PLAN_PAGE_SIZE)
        if not plan.tensor_count and plan.tensors:  # a server from before paging lists them all
            return plan
        token = plan.next_page_token
        while token:
            page = self._plan_page(request, PLAN_PAGE_SIZE, token)
            if page.fingerprint != plan.fingerprint or page.tensor_count != plan.tensor_count:
                raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION,
                                     f"plan: a page came from a server planning other weights (fingerprint "
                                     f"{page.fingerprint[:16]}, expected {plan.fingerprint[:16]}): are all replicas the same version?")
            if not page.tensors or len(plan.tensors) + len(page.tensors) > plan.tensor_count:
                break  # reported below
            plan.tensors.extend(page.tensors)
            token = page.next_page_token
        if len(plan.tensors) != plan.tensor_count:
            raise ModelInitError(grpc.StatusCode.DATA_LOSS,
                                 f"plan: the server's pages do not add up to its tensor_count {plan.tensor_count} "
                                 f"(stopped after {len(plan.tensors)} tensors)")
        plan.next_page_token = ""
        return plan

    def _plan_page(self, request: pb.ModelRequest, page_size: int = 0, page_token: str = "") -> pb.PlanResponse:
        """One Plan call (retried like any call): ``page_size`` tensors from ``page_token`` on."""
        if self._local is not None:
            try:
                return _check_version(request, self._local.plan(request, page_size, page_token))
            except ValueError as e:  # the same field-named message the server sends
                raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        backoff = _Backoff(self.retry)
        while True:
            try:
                plan = self._stub.Plan(pb.PlanRequest(request=request, page_size=page_size, page_token=page_token),
                                       timeout=self.timeout, metadata=_metadata())
            except grpc.RpcError as e:
                backoff.wait_or_raise(ModelInitError.from_rpc(e))
            else:
                return _check_version(request, plan)

    def _events(self, request: pb.ModelRequest, plan: pb.PlanResponse):
        """Every file's events from the local engine, or from the server's stream, resumed after
        a lost connection; closing it stops the producer."""
        if self._local is not None:
            try:
                return self._local.events(request)
            except ValueError as e:  # e.g. the requested device's engine is unavailable
                raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        return _ResumingEvents(self._replicas(plan.fingerprint), request, plan, None, 0, self.retry, self.timeout)

    def _replicas(self, fingerprint: str) -> "_Replicas":
        """The servers, the first known to plan ``fingerprint`` (``_plan`` asked it)."""
        return _Replicas(self._stubs, self.targets, fingerprint, self.timeout, checked={0})

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
        parallel: int = 1,
    ) -> InitResult:
        """Write the model's files (HF layout) into ``out_dir``; returns what was written.

        Each file goes to a hidden temp file, is checked against the server's SHA-256 and only
        then renamed into place; ``modelinit.json`` is written last, so a folder that has it is
        complete. On failure nothing that looks complete is left behind. A folder that already holds
        exactly these files (same fingerprint, every SHA-256 checked) is left as it is
        (``reused=True``). A remote stream that loses its server is resumed from the last byte
        received (see ``retry``); the bytes are the same. ``fsync`` also flushes
        every file to stable storage before its rename (safe against power loss, at disk speed;
        without it a killed process is still safe, the page cache keeps what was written).
        ``parallel`` (servers only): files fetched at once, spread over the replicas; each file
        resumes on the next replica if its server goes away. ``algorithm_version`` (None: the
        newest) and ``architecture`` (a class overriding the spec's) as in :meth:`plan`;
        ``modelinit.json`` records both. ``progress`` callables are then
        called from several threads. ``direct_io`` writes shards with ``O_DIRECT`` where the OS and filesystem allow it (no
        page-cache copy: faster, and no dirty pages charged to a container); False writes buffered.
        """
        if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, f"parallel: must be an integer >= 1, got {parallel!r}")
        request = model_request(spec, seed=seed, policy=policy, dtype=dtype, max_shard_size=max_shard_size,
                                algorithm_version=algorithm_version, architecture=architecture)
        plan = self._plan(request)
        for f in plan.files:  # before anything is written
            check_file_name(f.name)
        out = pathlib.Path(out_dir)
        reused = _reuse(out, plan)
        if reused is not None:
            return reused
        out.mkdir(parents=True, exist_ok=True)
        (out / MANIFEST_FILE).unlink(missing_ok=True)  # the folder is incomplete from here on
        bar = _progress_bar(progress, sum(f.size for f in plan.files))
        try:
            if self._local is None and (parallel > 1 or len(self._stubs) > 1):
                from .fanout import fetch

                written, self.last_served = fetch(self, request, plan, out, parallel, bar, fsync, direct_io)
            else:
                written = write_files(self._events(request, plan), plan, out, range(len(plan.files)), bar, fsync, direct_io)
        finally:
            bar(None)
        manifest = _manifest(plan, written)
        _atomic_write(out / MANIFEST_FILE, manifest, fsync)
        return InitResult(out, plan.fingerprint, tuple(written), plan.total_params, plan.total_bytes, plan.algorithm_version)


def write_files(source, plan: pb.PlanResponse, out: pathlib.Path, indices, progress: Callable[[int], None],
                fsync: bool, direct_io: bool) -> list[FileResult]:
    """Write the files ``indices`` (in that order) from ``source``'s events into ``out``: each to
    a hidden temp file (``O_DIRECT`` where allowed), hashed on a second thread while it is
    written, checked against the producer's size and SHA-256, then renamed into place. Closes
    ``source``; an interrupted file is deleted."""
    indices = list(indices)
    written: list[FileResult] = []
    current = None  # (index, temp path, file object, hasher)
    hasher = ThreadPoolExecutor(1, thread_name_prefix="modelinit-sha256")
    try:
        for event in source:
            if isinstance(event, Data):
                if current is None:
                    raise ModelInitError(grpc.StatusCode.DATA_LOSS, "stream: data before any file began")
                # Hash on a second thread while this one writes: both release the GIL.
                hashed = hasher.submit(current[3].update, event.data)
                current[2].write(event.data)
                hashed.result()
                progress(len(event.data))
            elif isinstance(event, Begin):
                expected_index = indices[len(written)] if len(written) < len(indices) else None
                if event.index != expected_index or event.name != plan.files[event.index].name or event.offset != 0 or current is not None:
                    raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"stream: unexpected file {event.name!r} (index {event.index})")
                tmp = out / f".{event.name}.partial"
                current = (event.index, tmp, DirectFile(tmp, direct_io), hashlib.sha256())
            else:
                if current is None or event.index != current[0]:
                    raise ModelInitError(grpc.StatusCode.DATA_LOSS, "stream: a file ended that never began")
                index, tmp, fh, digest = current
                size = fh.size
                fh.close(fsync)
                current = None
                expected = plan.files[index]
                got = digest.hexdigest()
                if size != expected.size or event.sha256 not in (None, got):
                    tmp.unlink(missing_ok=True)
                    raise ModelInitError(
                        grpc.StatusCode.DATA_LOSS,
                        f"{expected.name}: received {size} bytes with SHA-256 {got}, "
                        f"server says {expected.size} bytes with {event.sha256}",
                    )
                os.replace(tmp, out / expected.name)
                written.append(FileResult(expected.name, size, got))
    finally:
        source.close()  # a no-op after a complete stream; otherwise the producer stops now
        hasher.shutdown()
        if current is not None:  # interrupted mid-file: leave nothing half-written behind
            current[2].abort()
            current[1].unlink(missing_ok=True)
    if len(written) != len(indices):
        raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"stream: ended after {len(written)} of {len(indices)} files")
    return written


class _Replicas:
    """The servers of one client and the plan they must agree on: a replica serves only after
    it planned the same fingerprint (asked on first use, and again after it failed: a restarted
    server may run another version)."""

    def __init__(self, stubs: list, targets: tuple[str, ...], fingerprint: str, timeout: float | None,
                 checked: set[int] | None = None) -> None:
        self.stubs, self.targets, self._fingerprint, self._timeout = stubs, targets, fingerprint, timeout
        self._checked: set[int] = set(checked or ())
        self._lock = threading.Lock()

    def check(self, k: int, request: pb.ModelRequest) -> None:
        with self._lock:
            if k in self._checked:
                return
        plan = self.stubs[k].Plan(pb.PlanRequest(request=request), timeout=self._timeout, metadata=_metadata())
        if plan.fingerprint != self._fingerprint:
            raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"replica {self.targets[k]} plans different weights (fingerprint {plan.fingerprint[:16]}, "
                                 f"expected {self._fingerprint[:16]}): are all replicas the same version?")
        with self._lock:
            self._checked.add(k)

    def failed(self, k: int) -> None:
        with self._lock:
            self._checked.discard(k)


class _ResumingEvents:
    """The Init stream of some of a plan's files, resumed after a lost connection: it waits
    (backoff), moves to the next replica, checks its plan, and asks for the files not yet ended,
    the current one from the byte it has reached. The writer sees one continuous stream; a
    resumed file's End carries the SHA-256 of the whole file. ``replica`` says which server
    served the last file."""

    def __init__(self, replicas: _Replicas, request: pb.ModelRequest, plan: pb.PlanResponse, files: list[int] | None,
                 replica: int, retry: RetryPolicy, timeout: float | None) -> None:
        self._replicas, self._request, self._plan, self._files = replicas, request, plan, files
        self.replica = replica % len(replicas.stubs)
        self._retry, self._timeout = retry, timeout
        self._call = None
        self._closed = False

    def __iter__(self):
        plan, replicas = self._plan, self._replicas
        backoff = _Backoff(self._retry)
        todo = list(range(len(plan.files))) if self._files is None else list(self._files)
        current, offset = None, 0  # the file being received and its bytes so far
        resumed = False
        while not self._closed and todo:
            init = pb.InitRequest(request=self._request, offset=offset if current is not None else 0)
            if resumed or self._files is not None:
                init.files.extend(todo)
            try:
                replicas.check(self.replica, self._request)
                self._call = replicas.stubs[self.replica].Init(init, timeout=self._timeout, metadata=_metadata())
                for msg in self._call:
                    kind = msg.WhichOneof("event")
                    if kind == "data":
                        offset += len(msg.data)
                        backoff.progress()
                        yield Data(msg.data)
                    elif kind == "begin":
                        b = msg.begin
                        if current is not None:  # a resumed stream restates the file it resumes
                            if b.index != current or b.offset != offset:
                                raise ModelInitError(grpc.StatusCode.DATA_LOSS,
                                                     f"stream: resumed at file {b.index} byte {b.offset}, asked for file {current} byte {offset}")
                            continue
                        current, offset = b.index, b.offset
                        yield Begin(b.index, b.name, b.size, b.offset)
                    elif kind == "end":
                        if msg.end.index in todo:
                            todo.remove(msg.end.index)
                        current, offset = None, 0
                        yield End(msg.end.index, msg.end.sha256)
                return
            except grpc.RpcError as e:
                error = ModelInitError.from_rpc(e)
            if self._closed:
                return
            replicas.failed(self.replica)
            backoff.wait_or_raise(error)
            self.replica = (self.replica + 1) % len(replicas.stubs)
            where = f"{plan.files[current].name} at byte {offset}" if current is not None else "the next file"
            log.warning("resuming %s on %s", where, replicas.targets[self.replica])
            resumed = True

    def close(self) -> None:
        self._closed = True
        if self._call is not None:
            self._call.cancel()


#: gRPC target schemes whose address lists contain commas themselves (``ipv4:a:1,b:2``).
_LIST_SCHEMES = ("ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:")


def split_targets(target: str) -> tuple[str, ...]:
    """``"h1:1,h2:2"`` -> two targets; a gRPC URI (``dns:///...``, ``ipv4:a,b``) stays one."""
    target = target.strip()
    if "://" in target or target.startswith(_LIST_SCHEMES):
        parts = [target]
    else:
        parts = [t.strip() for t in target.split(",")]
    if not all(parts):
        raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, f"server: empty target in {target!r}; use host:port[,host:port...]")
    return tuple(parts)


def _channel_options(target: str) -> list[tuple[str, object]]:
    """A name resolving to several replicas (``dns:///``, ``ipv4:a,b``) is balanced call by call."""
    options = list(_CHANNEL_OPTIONS)
    if target.startswith(("dns:", "ipv4:", "ipv6:")):
        options.append(("grpc.service_config", json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})))
    return options


def _metadata() -> tuple[tuple[str, str], ...]:
    """A request id per call, logged by the server beside everything it does for the call."""
    return (("x-request-id", uuid.uuid4().hex),)


def _reuse(out: pathlib.Path, plan: pb.PlanResponse) -> "InitResult | None":
    """The result of an earlier run if ``out`` already holds exactly this plan's files, verified."""
    from .verify import is_complete

    files = [(f.name, f.size) for f in plan.files]
    if not (out / MANIFEST_FILE).is_file() or not is_complete(out, plan.fingerprint, plan.algorithm_version, files):
        return None
    doc = json.loads((out / MANIFEST_FILE).read_text(encoding="utf-8"))
    written = tuple(FileResult(f["name"], f["size"], f["sha256"]) for f in doc["files"])
    return InitResult(out, plan.fingerprint, written, plan.total_params, plan.total_bytes, plan.algorithm_version, reused=True)


def _check_version(request: pb.ModelRequest, plan: pb.PlanResponse) -> pb.PlanResponse:
    """A server older than the requested algorithm version ignores the field: refuse its plan."""
    if request.algorithm_version and plan.algorithm_version != request.algorithm_version:
        raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION,
                             f"algorithm_version: asked for version {request.algorithm_version}, the server plans version "
                             f"{plan.algorithm_version} (it predates version {request.algorithm_version}; upgrade it)")
    return plan


def _manifest(plan: pb.PlanResponse, written: list[FileResult]) -> bytes:
    """modelinit.json: what was asked, what algorithm made it, and every file's hash.
    ``request`` holds what replays the request exactly: its ``algorithm_version`` (the plan's,
    never 0) and the ``architecture`` override when one was given."""
    r = plan.request
    spec: dict[str, Any] = {"preset": r.spec.preset} if r.spec.HasField("preset") else {"config": json.loads(r.spec.config_json)}
    request: dict[str, Any] = {
        "spec": spec,
        "policy": json_format.MessageToDict(r.policy, preserving_proto_field_name=True),
        "seed": r.seed,
        "dtype": r.dtype,
        "max_shard_size": int(r.max_shard_size),
        "algorithm_version": plan.algorithm_version,
    }
    if r.spec.architecture:
        request["architecture"] = r.spec.architecture
    doc = {
        "algorithm_version": plan.algorithm_version,
        "fingerprint": plan.fingerprint,
        "family": plan.family,
        "architecture": plan.architecture,
        "total_params": plan.total_params,
        "total_bytes": plan.total_bytes,
        "transformers_version": plan.transformers_version,
        "request": request,
        "files": [{"name": w.name, "size": w.size, "sha256": w.sha256} for w in written],
    }
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def _atomic_write(path: pathlib.Path, data: bytes, fsync: bool) -> None:
    tmp = path.with_name(f".{path.name}.partial")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        if fsync:
            os.fsync(fh.fileno())
    os.replace(tmp, path)


def _progress_bar(progress: bool | Callable[[int], None], total: int) -> Callable[[int | None], None]:
    """``progress``: True -> a tqdm bar on stderr; a callable gets byte counts; False -> nothing.
    The returned function takes a byte count, or None to close."""
    if callable(progress):
        return lambda n: None if n is None else progress(n)
    if not progress:
        return lambda n: None
    from tqdm import tqdm

    bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="modelinit", leave=False)
    return lambda n: bar.close() if n is None else bar.update(n)
