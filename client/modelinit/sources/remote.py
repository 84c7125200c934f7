"""The remote source: a model planned and streamed by one or more modelinit servers over gRPC.

:class:`RemoteSource` implements :class:`~modelinit.sources.protocol.Source` over the generated stubs: a
call that loses its server is retried (:class:`RetryPolicy`, on the next replica), a stream is
resumed from the byte it reached (:class:`ResumingEvents`), and a replica serves only after it
planned the same fingerprint (:class:`Replicas`). A server that never answered and cannot be
connected to, or a TLS trust failure, is not retried (:func:`connect_failure`).
"""
from __future__ import annotations

import json
import logging
import threading
import uuid
from typing import Any, Callable, Iterable, Iterator

import crc32c
import grpc
from modelinit_wire.constants import MAX_CHUNK
from modelinit_wire.credentials import make_channel
from modelinit_wire.data_message import Checked
from modelinit_wire.events import Begin, Data, End
from modelinit_host.heap import keep_large_blocks
from modelinit_host.usable_cores import usable_cores
from modelinit_wire.v1 import modelinit_pb2 as pb

from ..errors import ModelInitError
from ..handoff import Events, FileResult, Write
from .fanout import each_file
from .retry import RETRYABLE, Backoff, RetryPolicy, connect_failure, give_up  # noqa: F401 - RETRYABLE, connect_failure: also the client's API
from .protocol import check_version
from .stub import ModelInitStub

_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 16 << 20)]
log = logging.getLogger("modelinit.client")  # the client's log, whichever module writes it


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


def channel_options(target: str) -> list[tuple[str, object]]:
    """A name resolving to several replicas (``dns:///``, ``ipv4:a,b``) is balanced call by call."""
    options: list[tuple[str, object]] = list(_CHANNEL_OPTIONS)
    if target.startswith(("dns:", "ipv4:", "ipv6:")):
        options.append(("grpc.service_config", json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})))
    return options


def call_metadata() -> tuple[tuple[str, str], ...]:
    """A request id per call, logged by the server beside everything it does for the call."""
    return (("x-request-id", uuid.uuid4().hex),)


class Replicas:
    """The servers of one client and the plan they must agree on: a replica serves only after
    it planned the same fingerprint (asked on first use, and again after it failed: a restarted
    server may run another version)."""

    def __init__(self, stubs: list, targets: tuple[str, ...], fingerprint: str, timeout: float | None,
                 checked: set[int] | None = None, reached: set[int] | None = None, no_crc: set[int] | None = None) -> None:
        self.stubs, self.targets, self._fingerprint, self._timeout = stubs, targets, fingerprint, timeout
        self._checked: set[int] = set(checked or ())
        self._reached: set[int] = reached if reached is not None else set()  # the client's own: shared
        self._no_crc: set[int] = no_crc if no_crc is not None else set()  # the client's own: said once
        self._lock = threading.Lock()

    def note_no_crc(self, k: int) -> None:
        """Replica ``k`` sent a data message without its CRC32C: said once per server and client."""
        with self._lock:
            if k in self._no_crc:
                return
            self._no_crc.add(k)
        log.warning("%s sends no CRC32C per message (a server older than the transit check): each file's SHA-256 is "
                    "computed here and checked against the server's instead", self.targets[k])

    def check(self, k: int, request: pb.ModelRequest) -> None:
        with self._lock:
            if k in self._checked:
                return
        plan = self.stubs[k].Plan(pb.PlanRequest(request=request), timeout=self._timeout, metadata=call_metadata())
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


#: Data messages in a row that may fail their CRC32C, each asked for again, before the stream
#: is given up (DATA_LOSS): corruption that repeats at one byte is no transient.
MAX_CORRUPTED = 3


class _Corrupted(Exception):
    """A data message whose running CRC32C is not the server's: asked for again from the byte before it."""


class _Resume:
    """The transit check and resume state of one stream (Init or Tensors), kept across its calls so
    that both streams check, count and move on alike: the running CRC32C of the current file's
    (selection's) bytes this call sent, the byte of it reached (where the next call resumes), the
    data messages in a row that failed their CRC32C, and the backoff that progress starts again."""

    def __init__(self, retry: RetryPolicy, targets: tuple[str, ...]) -> None:
        self._backoff = Backoff(retry)
        self._targets = targets
        self.running = 0
        self.reached = 0
        self.corrupted = 0

    def check(self, data, sent: int, where: str, k: int) -> None:
        """Add ``data`` (the message after byte :attr:`reached` of ``where``, from replica ``k``) to
        the running CRC32C; :class:`_Corrupted` when it is not the ``sent`` one."""
        self.running = crc32c.crc32c(data, self.running)
        if self.running != sent:
            raise _Corrupted(f"{where}: the data after byte {self.reached} failed its CRC32C (sent by {self._targets[k]})")

    def received(self, n: int) -> None:
        """``n`` bytes passed on: the corruption is not in a row, the next call resumes after them,
        and the backoff's deadline starts again."""
        self.corrupted = 0
        self.reached += n
        self._backoff.progress()

    def ask_again(self, error: _Corrupted) -> None:
        """One more corrupted message in a row: said (it is asked for again), or DATA_LOSS at
        :data:`MAX_CORRUPTED`."""
        self.corrupted += 1
        if self.corrupted >= MAX_CORRUPTED:
            raise ModelInitError(grpc.StatusCode.DATA_LOSS,
                                 f"{error} {self.corrupted} times in a row: something between server and client corrupts "
                                 "the stream (a proxy, a NIC, memory); nothing was kept from it") from None
        log.warning("%s; asking for it again", error)

    def move_on(self, error: ModelInitError, k: int, reached: bool) -> int:
        """Replica ``k`` failed with ``error``: wait, or raise (:meth:`Backoff.wait_or_raise`), and
        return the replica to ask next."""
        self._backoff.wait_or_raise(error, self._targets[k], reached)
        return (k + 1) % len(self._targets)


class ResumingEvents:
    """The Init stream of some of a plan's files, resumed after a lost connection: it waits
    (backoff), moves to the next replica, checks its plan, and asks for the files not yet ended,
    the current one from the byte it has reached. The writer sees one continuous stream; a
    resumed file's End carries the SHA-256 of the whole file. ``replica`` says which server
    served the last file.

    Every data message is checked on receipt against the running CRC32C the server sends beside
    it (``InitRequest.transit_crc32c``): one that fails is dropped and asked for again at once
    from the byte before it, on the same server (:data:`MAX_CORRUPTED` in a row end the stream,
    DATA_LOSS). Checked bytes are passed on as ``Data(checked=True)``: the writer need not hash
    them (``rehash``: it still does). A server that sends no CRC (older than the field) is said
    once (``replicas.notes``), and its bytes are hashed by the writer as before."""

    def __init__(self, replicas: Replicas, request: pb.ModelRequest, plan: pb.PlanResponse, files: list[int] | None,
                 replica: int, retry: RetryPolicy, timeout: float | None, rehash: bool = False) -> None:
        self._replicas, self._request, self._plan, self._files = replicas, request, plan, files
        self.replica = replica % len(replicas.stubs)
        self._retry, self._timeout, self._rehash = retry, timeout, rehash
        self._call = None
        self._closed = False

    def __iter__(self):
        plan, replicas = self._plan, self._replicas
        resume = _Resume(self._retry, replicas.targets)  # resume.reached: the current file's bytes so far
        todo = list(range(len(plan.files))) if self._files is None else list(self._files)
        current = None  # the file being received
        resumed = False
        while not self._closed and todo:
            init = pb.InitRequest(request=self._request, offset=resume.reached if current is not None else 0,
                                  chunk_size=MAX_CHUNK, transit_crc32c=True)
            if resumed or self._files is not None:
                init.files.extend(todo)
            resume.running = 0
            try:
                replicas.check(self.replica, self._request)
                self._call = replicas.stubs[self.replica].Init(init, timeout=self._timeout, metadata=call_metadata())
                for msg in self._call:
                    # a data message's payload (modelinit.sources.stub: with its CRC32C when sent), or a message the stub left parsed
                    kind = "data" if isinstance(msg, (memoryview, Checked)) else msg.WhichOneof("event")
                    if kind == "data":
                        data, sent = _data_and_crc(msg)
                        if sent is None:
                            replicas.note_no_crc(self.replica)
                        else:
                            where = plan.files[current].name if current is not None else "stream"
                            resume.check(data, sent, where, self.replica)
                        resume.received(len(data))
                        yield Data(data, checked=sent is not None and not self._rehash)
                    elif kind == "begin":
                        b = msg.begin
                        resume.running = 0
                        if current is not None:  # a resumed stream restates the file it resumes
                            if b.index != current or b.offset != resume.reached:
                                raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"stream: resumed at file {b.index} byte "
                                                     f"{b.offset}, asked for file {current} byte {resume.reached}")
                            continue
                        current, resume.reached = b.index, b.offset
                        yield Begin(b.index, b.name, b.size, b.offset)
                    elif kind == "end":
                        if msg.end.index in todo:
                            todo.remove(msg.end.index)
                        current, resume.reached = None, 0
                        yield End(msg.end.index, msg.end.sha256)
                return
            except _Corrupted as e:
                self._call.cancel()
                resume.ask_again(e)
                resumed = True
                continue
            except grpc.RpcError as e:
                error = ModelInitError.from_rpc(e)
            if self._closed:
                return
            replicas.failed(self.replica)
            self.replica = resume.move_on(error, self.replica, replicas.retry_as_lost(self.replica))
            where = f"{plan.files[current].name} at byte {resume.reached}" if current is not None else "the next file"
            log.warning("resuming %s on %s", where, replicas.targets[self.replica])
            resumed = True

    def close(self) -> None:
        self._closed = True
        if self._call is not None:
            self._call.cancel()


def _data_and_crc(msg) -> tuple[Any, int | None]:
    """A data message's payload and the CRC32C sent beside it (None: none sent)."""
    if isinstance(msg, Checked):
        return msg.payload, msg.crc32c
    if isinstance(msg, memoryview):
        return msg, None
    return msg.data, (msg.crc32c if msg.HasField("crc32c") else None)


class RemoteSource:
    """modelinit servers as a :class:`~modelinit.sources.protocol.Source`: ``target`` is one address, a
    comma-separated list of replicas, or a gRPC name resolving to several (``dns:///``, balanced
    round-robin). ``tls``/``ca``/``cert``/``key``/``token`` as in
    :func:`modelinit_wire.credentials.make_channel`; ``timeout`` in seconds per call; ``retry`` how a
    lost server is ridden out; ``rehash``: hash what arrives here too (each data message's
    CRC32C is checked either way). INVALID_ARGUMENT for a bad target or credential file."""

    in_process = False
    """The bytes crossed a wire: writers hash those that came without a transit check the source
    verified (``Data.checked``) and check the server's SHA-256."""
    last_served: dict[str, int]
    """How many files each target finished in the last :meth:`stream_files`."""

    def __init__(self, target: str, *, timeout: float | None = None, tls: bool = False, ca: str | None = None,
                 cert: str | None = None, key: str | None = None, token: str | None = None,
                 retry: RetryPolicy | None = None, rehash: bool = False) -> None:
        self.targets = split_targets(target)
        self.rehash = rehash
        """Hash every received byte here too (a second SHA-256 pass), beside each message's CRC32C."""
        self.last_served = {}
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        try:
            self._channels = [make_channel(t, tls=tls, ca=ca, cert=cert, key=key, token=token, options=channel_options(t))
                              for t in self.targets]
        except ValueError as e:
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        self.stubs = [ModelInitStub(ch) for ch in self._channels]
        keep_large_blocks()  # streams fault every received message's pages in otherwise (modelinit_host.heap)
        self._reached: set[int] = set()
        """Targets (indices) that ever answered: a connection failure to one of them is a lost
        server, retried; to any other, a wrong address, raised at once."""
        self.planner = 0
        """The target that answered the last Plan: streams start there."""
        self._no_crc: set[int] = set()
        """Targets that sent data without its CRC32C (said once)."""

    def close(self) -> None:
        for ch in self._channels:
            ch.close()

    def plan(self, request: pb.ModelRequest, page_size: int = 0, page_token: str = "") -> pb.PlanResponse:
        """One Plan call (retried like any call, on the next target after a failure):
        ``page_size`` tensors from ``page_token`` on."""
        backoff = Backoff(self.retry)
        k, tried = self.planner, set()
        while True:
            tried.add(k)
            try:
                plan = self.stubs[k].Plan(pb.PlanRequest(request=request, page_size=page_size, page_token=page_token),
                                          timeout=self.timeout, metadata=call_metadata())
            except grpc.RpcError as e:
                error = ModelInitError.from_rpc(e)
                if error.code != grpc.StatusCode.UNAVAILABLE:
                    self._reached.add(k)  # it answered
                fatal = give_up(error, self.targets[k], k in self._reached)
                following = (k + 1) % len(self.stubs)
                if fatal is not None and fatal is not error and following not in tried:
                    log.warning("%s; trying %s", fatal.details, self.targets[following])  # another replica may answer
                else:
                    backoff.wait_or_raise(error, self.targets[k], k in self._reached)
                k = following
            else:
                self._reached.add(k)
                self.planner = k
                return check_version(request, plan)

    def tensors(self, request: pb.TensorsRequest) -> Iterator[pb.TensorsResponse | memoryview]:
        """One Tensors stream, starting on the replica that planned last. A failed call is retried
        like a Plan (backoff, next replica); once a selection has begun, the next call resumes
        at it, from the byte reached (``start``/``offset``), and the TensorBegin the server
        restates is checked (same selection, byte and fingerprint: DATA_LOSS otherwise) and not
        passed on: the consumer sees one continuous stream. Every data message is checked on
        receipt against the running CRC32C sent beside it (``transit_crc32c``); one that fails is
        dropped and asked for again at once from the byte before it (:data:`MAX_CORRUPTED` in a
        row: DATA_LOSS). A data message is passed on as a memoryview of its payload (or a parsed
        message, as the stub left it)."""
        resume = _Resume(self.retry, self.targets)  # resume.reached: the byte of the current selection's data reached
        k = self.planner
        asked, request = request, pb.TensorsRequest()
        request.CopyFrom(asked)  # the caller's untouched
        request.transit_crc32c = True
        if not request.chunk_size:  # the fewest messages (modelinit_wire.constants.MAX_CHUNK)
            request.chunk_size = MAX_CHUNK
        current: pb.TensorBegin | None = None  # the selection being received
        ask = request
        while True:
            restated = current is not None
            resume.running = 0
            try:
                call = self.stubs[k].Tensors(ask, timeout=self.timeout, metadata=call_metadata())
                try:
                    for msg in call:
                        if not isinstance(msg, (memoryview, Checked)) and msg.WhichOneof("event") == "begin":
                            b = msg.begin
                            resume.running = 0
                            if restated and current is not None:
                                restated = False
                                if (b.index, b.offset, b.fingerprint) != (current.index, resume.reached, current.fingerprint):
                                    raise ModelInitError(grpc.StatusCode.DATA_LOSS,
                                                         f"tensors: resumed at selection {b.index} byte {b.offset} (fingerprint "
                                                         f"{b.fingerprint[:16]}), asked for selection {current.index} byte "
                                                         f"{resume.reached} (fingerprint {current.fingerprint[:16]})")
                                continue
                            current, resume.reached = b, b.offset
                        else:  # data: its payload (modelinit.sources.stub: with its CRC32C when sent), or a parsed message
                            data, sent = _data_and_crc(msg)
                            if sent is not None:
                                where = current.name if current is not None else "tensors"
                                resume.check(data, sent, where, k)
                            resume.received(len(data))
                            msg = data if isinstance(msg, Checked) else msg
                        yield msg
                finally:
                    call.cancel()  # a consumer that stops early ends the call (no-op after the end)
                self._reached.add(k)
                return
            except _Corrupted as e:
                resume.ask_again(e)
            except grpc.RpcError as e:
                error = ModelInitError.from_rpc(e)
                if error.code != grpc.StatusCode.UNAVAILABLE:
                    self._reached.add(k)
                k = resume.move_on(error, k, k in self._reached or len(self.stubs) > 1)
            if current is not None:
                ask = pb.TensorsRequest()
                ask.CopyFrom(request)
                ask.start, ask.offset = current.index, resume.reached
                log.warning("resuming tensor %s at byte %d on %s", current.name, resume.reached, self.targets[k])

    def replicas(self, fingerprint: str) -> Replicas:
        """The servers, the one that answered the last :meth:`plan` known to plan ``fingerprint``."""
        return Replicas(self.stubs, self.targets, fingerprint, self.timeout, checked={self.planner}, reached=self._reached,
                        no_crc=self._no_crc)

    @staticmethod
    def files_at_once() -> int:
        """How many files to fetch at once when the caller does not say: a quarter of this node's
        usable cores (1 up to 7 cores). A file's stream costs the client a core's share to receive
        and write at about 1 GB/s (its bytes are CRC-checked, not hashed); the server hashes each
        file as one serial SHA-256 stream (about 1.4 GB/s a core), so several files in flight let
        a many-core server hash on several cores. A server's ``--max-streams`` (16 by default)
        bounds what many clients may ask at once."""
        return max(1, usable_cores() // 4)

    def stream_files(self, request: pb.ModelRequest, plan: pb.PlanResponse, files: list[int], write: Write,
                     parallel: int | None, progress: Callable[[int], None]) -> list[FileResult]:
        """``files`` through ``write``. With one server and one file at a time, one resumable
        stream. Otherwise each file is its own resumable stream of that file alone, ``parallel`` at
        once (None: :meth:`files_at_once`), file ``i`` starting on replica ``i mod n`` and moving on
        to the next replica from the byte reached when its server goes away; a replica serves only
        after it planned the same fingerprint (one :class:`Replicas` shared by the streams). Sets
        :attr:`last_served`."""
        parallel = self.files_at_once() if parallel is None else parallel
        self.last_served = {}
        if parallel == 1 and len(self.targets) == 1:
            everything = files == list(range(len(plan.files)))
            return write(self.events(request, plan, None if everything else files), files, progress)
        replicas = self.replicas(plan.fingerprint)
        served = {t: 0 for t in self.targets}

        def open_stream(i: int) -> ResumingEvents:
            return self.events(request, plan, [i], replicas=replicas, start=i)

        def count(i: int, stream: Events) -> None:
            assert isinstance(stream, ResumingEvents)  # open_stream's
            served[self.targets[stream.replica]] += 1

        written = each_file(open_stream, files, write, parallel, progress, count)
        self.last_served = served
        return written

    def events(self, request: pb.ModelRequest, plan: pb.PlanResponse, files: Iterable[int] | None = None, *,
               replicas: Replicas | None = None, start: int | None = None) -> ResumingEvents:
        """The Init stream of ``files`` (all by default), resumed after a lost connection; it
        starts on replica ``start`` (default: the one that planned) of ``replicas`` (default: a
        fresh set for ``plan``; the fan-out shares one among its streams)."""
        return ResumingEvents(replicas or self.replicas(plan.fingerprint), request, plan,
                              None if files is None else list(files), self.planner if start is None else start,
                              self.retry, self.timeout, self.rehash)
