"""The client: plan a model, stream its files into a folder, verify every byte."""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import pathlib
import random
import stat
import re
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Union

import grpc

from . import policy_file
from .direct_file import CREATE_FLAGS, DirectFile
from .errors import ModelInitError
from .events import Begin, Data, End
from .folder_lock import FolderLock
from .v1 import modelinit_pb2 as pb
from .v1 import modelinit_pb2_grpc as pb_grpc

MANIFEST_FILE = "modelinit.json"
PROGRESS_FILE = ".modelinit.progress.json"
"""The hidden record of an unfinished ``init_model``: its fingerprint, the files already renamed
into place with their SHA-256 (a rerun of the same weights keeps those that still match), and
the files of an earlier run still to be deleted. Removed once ``modelinit.json`` is written."""
MAX_NAME_BYTES = 200
"""Longest file name taken from a server, in UTF-8 bytes: filesystems allow 255, and the temp
file ``.NAME.partial`` adds 9."""
#: What a loader (transformers, safetensors, torch) may read from a model folder: weights, their
#: indexes, the model config. Such a file that no modelinit run recorded is "foreign": init_model
#: refuses to write beside it unless ``overwrite``. Anything else (tokenizer files, README, other
#: JSON, subfolders) is the user's and is left alone.
_LOADER_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".index.json")
_LOADER_NAMES = frozenset({"config.json"})
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


def connect_failure(details: str) -> tuple[str, str] | None:
    """What kept an UNAVAILABLE call from reaching any server, from its details: ``("trust",
    reason)`` when the TLS handshake failed (an untrusted or misnamed certificate, a server that
    does not speak TLS: retrying cannot fix it), ``("connect", reason)`` when no connection was
    made (refused, unknown name, closed during setup); None for anything else (a server that
    went away mid-call, one that is stopping)."""
    d = details.lower()
    if "certificate_verify_failed" in d:
        m = re.search(r"CERTIFICATE_VERIFY_FAILED: ([^:]+)", details)
        why = f" ({m.group(1).strip()})" if m else ""
        return "trust", (f"TLS handshake failed: the server's certificate is not trusted{why}; pass the CA that signed it "
                         "with --tls-ca")
    if "hostname verification" in d or "not in peer certificate" in d:
        return "trust", ("TLS handshake failed: the server's certificate does not name this address; dial a name it "
                         "holds, or reissue the certificate with this one")
    if "wrong_version_number" in d:
        return "trust", "TLS handshake failed: the server does not speak TLS; drop --tls/--tls-ca or check --server"
    if "ssl_error_ssl" in d:  # a TLS protocol error, not a lost connection (SSL_ERROR_SYSCALL)
        m = re.search(r"OPENSSL_internal:([A-Z0-9_]+)", details)
        why = f" ({m.group(1)})" if m else ""
        return "trust", f"TLS handshake failed{why}; check --tls-ca, --tls-cert and --tls-key"
    if "errors resolving" in d or "dns resolution failed" in d or "name resolution" in d:
        return "connect", "the name does not resolve; check --server"
    if "failed to connect" not in d:
        return None
    if "connection refused" in d:
        return "connect", "connection refused; check --server (host:port) and that the server is running"
    if "socket closed" in d or "connection reset" in d:
        return "connect", ("the server closed the connection during setup (a TLS server dialled without --tls, or a "
                           "mutual-TLS server refusing this client's certificate?); check --server and the TLS flags")
    reason = details.rsplit(": ", 1)[-1].strip() or "failed to connect"
    return "connect", f"{reason}; check --server"


def _give_up(error: ModelInitError, target: str | None, reached: bool) -> ModelInitError | None:
    """The error to raise at once instead of retrying ``error``: any answer but UNAVAILABLE, a
    TLS trust failure, or a connection failure to a ``target`` this client never ``reached``
    (a mistyped address is not going to come up); None: retry."""
    if error.code not in RETRYABLE:
        return error
    failure = connect_failure(error.details)
    if failure is None or (failure[0] == "connect" and reached):
        return None  # a server that answered before and is gone now: restarting, draining
    return ModelInitError(error.code, f"cannot reach {target or 'the server'}: {failure[1]}")


class _Backoff:
    """Waits between tries until the policy's deadline, counted from the first failure since the
    last ``progress()``."""

    def __init__(self, policy: RetryPolicy) -> None:
        self._policy = policy
        self.progress()

    def progress(self) -> None:
        self._since: float | None = None
        self._wait = self._policy.initial_backoff

    def wait_or_raise(self, error: ModelInitError, target: str | None = None, reached: bool = True) -> None:
        """Sleep before the next try, or raise: an error that is no reason to retry (see
        :func:`_give_up`; ``reached``: this client got an answer from ``target`` before), or any
        once the deadline has passed."""
        fatal = _give_up(error, target, reached)
        if fatal is not None:
            raise fatal
        now = time.monotonic()
        if self._since is None:
            self._since = now
        left = self._since + self._policy.deadline - now
        if left <= 0:
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
    kept: tuple[str, ...] = ()
    """Files an interrupted run of the same weights had finished, re-hashed and kept (not fetched
    again)."""


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
    """Refuse any server-supplied name that could write outside the output folder, replace what
    modelinit keeps there (``modelinit.json``; hidden names: temp files, the progress record, the
    lock) or that a filesystem may not take (over ``MAX_NAME_BYTES``)."""
    why = None
    if not name or name in (".", "..") or any(c in name for c in "/\\\0:") or os.path.isabs(name):
        why = "it could write outside the output folder"
    elif name.startswith("."):
        why = "hidden names are modelinit's own: temp files, progress record, lock"
    elif name.casefold() == MANIFEST_FILE:
        why = f"{MANIFEST_FILE} is the manifest modelinit writes itself"
    elif len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        why = f"longer than {MAX_NAME_BYTES} bytes"
    if why is not None:
        shown = name if len(name) <= 80 else f"{name[:60]}...{name[-12:]}"
        raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"server sent an unsafe file name {shown!r} ({why}); refusing to write it")
    return name


def loader_file(name: str) -> bool:
    """Whether a loader may read ``name`` from a model folder: weights, an index, config.json
    (hidden names aside)."""
    return not name.startswith(".") and (name in _LOADER_NAMES or name.endswith(_LOADER_SUFFIXES))


def _check_plan_names(plan: pb.PlanResponse) -> None:
    """Every planned name safe, and none twice (nor twice but for case)."""
    seen: set[str] = set()
    for f in plan.files:
        check_file_name(f.name)
        if f.name.casefold() in seen:
            raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"server planned the file {f.name!r} twice; refusing to write it")
        seen.add(f.name.casefold())


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
    lost connection is retried; a stream resumes from the byte it had reached). A server that
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
        self._reached: set[int] = set()
        """Targets (indices) that ever answered this client: a connection failure to one of them
        is a lost server, retried; to any other, a wrong address, raised at once."""
        self._planner = 0
        """The target that answered the last Plan: streams start there."""

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
        """One Plan call (retried like any call, on the next target after a failure):
        ``page_size`` tensors from ``page_token`` on."""
        if self._local is not None:
            try:
                return _check_version(request, self._local.plan(request, page_size, page_token))
            except ValueError as e:  # the same field-named message the server sends
                raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        backoff = _Backoff(self.retry)
        k, tried = self._planner, set()
        while True:
            tried.add(k)
            try:
                plan = self._stubs[k].Plan(pb.PlanRequest(request=request, page_size=page_size, page_token=page_token),
                                           timeout=self.timeout, metadata=_metadata())
            except grpc.RpcError as e:
                error = ModelInitError.from_rpc(e)
                if error.code != grpc.StatusCode.UNAVAILABLE:
                    self._reached.add(k)  # it answered
                fatal = _give_up(error, self.targets[k], k in self._reached)
                following = (k + 1) % len(self._stubs)
                if fatal is not None and fatal is not error and following not in tried:
                    log.warning("%s; trying %s", fatal.details, self.targets[following])  # another replica may answer
                else:
                    backoff.wait_or_raise(error, self.targets[k], k in self._reached)
                k = following
            else:
                self._reached.add(k)
                self._planner = k
                return _check_version(request, plan)

    def _events(self, request: pb.ModelRequest, plan: pb.PlanResponse, files: list[int] | None = None):
        """Every file's events (or those of ``files``, indices into the plan's, in that order) from
        the local engine, or from the server's stream, resumed after a lost connection; closing
        it stops the producer."""
        if self._local is not None:
            try:
                return self._local.events(request) if files is None else self._local.events(request, files)
            except ValueError as e:  # e.g. the requested device's engine is unavailable
                raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        return _ResumingEvents(self._replicas(plan.fingerprint), request, plan, files, self._planner, self.retry, self.timeout)

    def _replicas(self, fingerprint: str) -> "_Replicas":
        """The servers, the one that answered ``_plan`` known to plan ``fingerprint``."""
        return _Replicas(self._stubs, self.targets, fingerprint, self.timeout, checked={self._planner}, reached=self._reached)

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
        overwrite: bool = False,
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
        if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, f"parallel: must be an integer >= 1, got {parallel!r}")
        request = model_request(spec, seed=seed, policy=policy, dtype=dtype, max_shard_size=max_shard_size,
                                algorithm_version=algorithm_version, architecture=architecture)
        plan = self._plan(request)
        _check_plan_names(plan)  # before anything is written
        out = pathlib.Path(out_dir)
        lock = FolderLock(out)  # one init per folder at a time: a second one fails at once
        try:
            lock.acquire()
            record = _prepare(out, plan, overwrite, fsync)
            if isinstance(record, InitResult):
                return record
            kept = dict(record.files)
            todo = [i for i in range(len(plan.files)) if i not in kept]
            if kept:
                log.info("%s: keeping %d file(s) an interrupted run finished (re-hashed)", out, len(kept))
            bar = _progress_bar(progress, sum(plan.files[i].size for i in todo))
            try:
                files = None if len(todo) == len(plan.files) else todo
                if not todo:
                    written = []
                elif self._local is None and (parallel > 1 or len(self._stubs) > 1):
                    from .fanout import fetch

                    written, self.last_served = fetch(self, request, plan, out, parallel, bar, fsync, direct_io,
                                                      files=files, on_written=record.add)
                else:
                    written = write_files(self._events(request, plan, files), plan, out, todo, bar, fsync, direct_io,
                                          on_written=record.add)
            except BaseException:
                record.drop_if_empty()  # a failed run that finished nothing leaves nothing behind
                raise
            finally:
                bar(None)
            results = {**kept, **dict(zip(todo, written))}
            ordered = [results[i] for i in range(len(plan.files))]
            _atomic_write(out / MANIFEST_FILE, _manifest(plan, ordered), fsync)
            (out / PROGRESS_FILE).unlink(missing_ok=True)  # complete: the manifest says it all
        except OSError as e:
            raise _os_error(e, out) from e
        finally:
            lock.release()
        return InitResult(out, plan.fingerprint, tuple(ordered), plan.total_params, plan.total_bytes, plan.algorithm_version,
                          kept=tuple(kept[i].name for i in sorted(kept)))

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
        from .verify import manifest_request, plan_differences, read_manifest

        try:
            doc = read_manifest(manifest)
        except ModelInitError as e:
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, f"from_manifest: {e.details}") from None
        request = manifest_request(doc)
        differences = plan_differences(doc, self._plan(request))
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


def write_files(source, plan: pb.PlanResponse, out: pathlib.Path, indices, progress: Callable[[int], None],
                fsync: bool, direct_io: bool,
                on_written: Callable[[int, FileResult], None] | None = None) -> list[FileResult]:
    """Write the files ``indices`` (in that order) from ``source``'s events into ``out``: each to
    a hidden temp file (created exclusively, never through a link; ``O_DIRECT`` where allowed),
    hashed on a second thread while it is written, checked against the producer's size and
    SHA-256, then renamed into place; ``on_written(index, result)`` follows each rename. A file
    is refused (DATA_LOSS) at the first byte past its planned size. Closes ``source``; an
    interrupted file is deleted; an OSError (disk full) is raised as ModelInitError."""
    indices = list(indices)
    written: list[FileResult] = []
    current = None  # (index, temp path, file object, hasher, planned size)
    hasher = ThreadPoolExecutor(1, thread_name_prefix="modelinit-sha256")
    try:
        for event in source:
            if isinstance(event, Data):
                if current is None:
                    raise ModelInitError(grpc.StatusCode.DATA_LOSS, "stream: data before any file began")
                with memoryview(event.data) as view:
                    n = view.nbytes
                if current[2].size + n > current[4]:
                    raise ModelInitError(grpc.StatusCode.DATA_LOSS,
                                         f"{plan.files[current[0]].name}: the server sent more than the {current[4]} bytes "
                                         f"planned; refusing the rest")
                # Hash on a second thread while this one writes: both release the GIL.
                hashed = hasher.submit(current[3].update, event.data)
                try:
                    current[2].write(event.data)
                finally:
                    hashed.result()
                progress(n)
            elif isinstance(event, Begin):
                expected_index = indices[len(written)] if len(written) < len(indices) else None
                if event.index != expected_index or event.name != plan.files[event.index].name or event.offset != 0 or current is not None:
                    raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"stream: unexpected file {event.name!r} (index {event.index})")
                if event.size != plan.files[event.index].size:
                    raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"stream: {event.name} begins as {event.size} bytes, "
                                                                    f"the plan says {plan.files[event.index].size}")
                tmp = out / f".{event.name}.partial"
                tmp.unlink(missing_ok=True)  # a stale temp file (or a link planted there) goes, never written through
                current = (event.index, tmp, DirectFile(tmp, direct_io), hashlib.sha256(), event.size)
            else:
                if current is None or event.index != current[0]:
                    raise ModelInitError(grpc.StatusCode.DATA_LOSS, "stream: a file ended that never began")
                index, tmp, fh, digest, _ = current
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
                if on_written is not None:
                    on_written(index, written[-1])
    except OSError as e:
        raise _os_error(e, out, plan.files[current[0]].name if current is not None else None) from e
    finally:
        try:
            source.close()  # a no-op after a complete stream; otherwise the producer stops now
        finally:
            hasher.shutdown()
            if current is not None:  # interrupted mid-file: leave nothing half-written behind
                _discard(current[2], current[1])
    if len(written) != len(indices):
        raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"stream: ended after {len(written)} of {len(indices)} files")
    return written


class _Replicas:
    """The servers of one client and the plan they must agree on: a replica serves only after
    it planned the same fingerprint (asked on first use, and again after it failed: a restarted
    server may run another version)."""

    def __init__(self, stubs: list, targets: tuple[str, ...], fingerprint: str, timeout: float | None,
                 checked: set[int] | None = None, reached: set[int] | None = None) -> None:
        self.stubs, self.targets, self._fingerprint, self._timeout = stubs, targets, fingerprint, timeout
        self._checked: set[int] = set(checked or ())
        self._reached: set[int] = reached if reached is not None else set()  # the client's own: shared
        self._lock = threading.Lock()

    def check(self, k: int, request: pb.ModelRequest) -> None:
        with self._lock:
            if k in self._checked:
                return
        plan = self.stubs[k].Plan(pb.PlanRequest(request=request), timeout=self._timeout, metadata=_metadata())
        self.answered(k)  # (a replica in _checked answered its Plan already)
        if plan.fingerprint != self._fingerprint:
            raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"replica {self.targets[k]} plans different weights (fingerprint {plan.fingerprint[:16]}, "
                                 f"expected {self._fingerprint[:16]}): are all replicas the same version?")
        with self._lock:
            self._checked.add(k)

    def failed(self, k: int) -> None:
        with self._lock:
            self._checked.discard(k)

    def answered(self, k: int) -> None:
        """Replica ``k`` answered a call: from now on a connection failure there is a lost server."""
        with self._lock:
            self._reached.add(k)

    def retry_as_lost(self, k: int) -> bool:
        """Whether a connection failure at replica ``k`` is retried (as a lost server): it answered
        before, or another replica can take over (one that is down from the start is skipped)."""
        with self._lock:
            return k in self._reached or len(self.stubs) > 1


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
            backoff.wait_or_raise(error, replicas.targets[self.replica], replicas.retry_as_lost(self.replica))
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


@dataclass(frozen=True)
class _Record:
    """What a ``modelinit.json`` or a progress record in the folder says, leniently read."""

    fingerprint: str
    algorithm_version: int
    files: tuple[FileResult, ...]
    """Files the run finished, with their SHA-256 (safe plain names only)."""
    stale: tuple[str, ...] = ()
    """Files of an earlier run a progress record's run was deleting."""


def _read_record(path: pathlib.Path) -> "_Record | None":
    """The record at ``path``; None when it cannot be read as one."""
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None

    def safe(name: object) -> bool:
        try:
            return isinstance(name, str) and check_file_name(name) == name
        except ModelInitError:
            return False

    files = doc.get("files") if isinstance(doc.get("files"), list) else []
    stale = doc.get("stale") if isinstance(doc.get("stale"), list) else []
    fingerprint, version = doc.get("fingerprint"), doc.get("algorithm_version")
    return _Record(
        fingerprint if isinstance(fingerprint, str) else "",
        version if type(version) is int else -1,
        tuple(FileResult(f["name"], f["size"], f["sha256"]) for f in files
              if isinstance(f, dict) and safe(f.get("name")) and type(f.get("size")) is int and isinstance(f.get("sha256"), str)),
        tuple(n for n in stale if safe(n)),
    )


class _Progress:
    """This run's progress record (``PROGRESS_FILE``): rewritten atomically after each file is
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
        doc = {
            "fingerprint": self._plan.fingerprint,
            "algorithm_version": self._plan.algorithm_version,
            "files": [{"name": f.name, "size": f.size, "sha256": f.sha256} for _, f in sorted(self.files.items())],
            "stale": self._stale,
        }
        _atomic_write(self._path, (json.dumps(doc, indent=1) + "\n").encode(), self._fsync)


def _prepare(out: pathlib.Path, plan: pb.PlanResponse, overwrite: bool, fsync: bool) -> "InitResult | _Progress":
    """Survey ``out`` before writing ``plan`` into it, and clear what must go.

    Ours: the files that ``modelinit.json`` or a progress record lists, and hidden ``.*.partial``
    temp files. Of ours, the files of this plan (same fingerprint and algorithm version, name and
    size) whose SHA-256 still matches the record are kept; the rest is deleted. Foreign: a file
    no record lists that a loader would pick up (see ``_LOADER_SUFFIXES``, or a name of this
    plan); refused (FAILED_PRECONDITION, before anything is touched) unless ``overwrite``, which
    deletes them. Returns the reused result when ``modelinit.json`` already describes exactly
    this plan and every file is kept; otherwise the new progress record (saved before the
    manifest and the stale files are deleted, so an interruption leaves them recorded)."""
    from .verify import _sha256_file, read_manifest

    try:
        entries = {e.name: e for e in os.scandir(out)}
    except FileNotFoundError:
        entries = {}
    manifest = _read_record(out / MANIFEST_FILE) if MANIFEST_FILE in entries else None
    progress = _read_record(out / PROGRESS_FILE) if PROGRESS_FILE in entries else None
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
            if stat.S_ISREG(st.st_mode) and st.st_size == f.size and _sha256_file(out / f.name) == f.sha256:
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
        files = tuple(kept[i] for i in range(len(plan.files)))
        return InitResult(out, plan.fingerprint, files, plan.total_params, plan.total_bytes, plan.algorithm_version, reused=True)
    out.mkdir(parents=True, exist_ok=True)
    record = _Progress(out, plan, kept, stale, fsync)
    record.save()
    (out / MANIFEST_FILE).unlink(missing_ok=True)  # the folder is incomplete from here on
    for name in stale + temps:
        (out / name).unlink(missing_ok=True)
    record.cleaned()
    return record


def _os_error(e: OSError, out: pathlib.Path, name: str | None = None) -> ModelInitError:
    """A failed write into ``out`` as a ModelInitError: RESOURCE_EXHAUSTED for a full disk or
    quota, PERMISSION_DENIED for a refused write, FAILED_PRECONDITION otherwise."""
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG):
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        code = grpc.StatusCode.PERMISSION_DENIED
    else:
        code = grpc.StatusCode.FAILED_PRECONDITION
    what = f"writing {name}" if name else (str(e.filename) if e.filename else "")
    return ModelInitError(code, ": ".join(p for p in (str(out), what, e.strerror or str(e)) if p))


def _discard(fh: DirectFile, tmp: pathlib.Path) -> None:
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
    try:
        policy = policy_file.to_dict(r.policy)  # the policy-file format: `--policy` takes it back
    except ValueError as e:  # only a server that echoes a policy it could not have planned
        raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"plan: the server echoed a malformed {e}") from None
    request: dict[str, Any] = {
        "spec": spec,
        "policy": policy,
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


def _progress_bar(progress: bool | Callable[[int], None], total: int) -> Callable[[int | None], None]:
    """``progress``: True -> a tqdm bar on stderr; a callable gets byte counts; False -> nothing.
    The returned function takes a byte count, or None to close."""
    if callable(progress):
        return lambda n: None if n is None else progress(n)
    if not progress:
        return lambda n: None
    from tqdm import tqdm

    # Decimal units (kB, MB, GB), as the summary line and --max-shard-size's "5GB" count them.
    bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1000, desc="modelinit", leave=False)
    return lambda n: bar.close() if n is None else bar.update(n)
