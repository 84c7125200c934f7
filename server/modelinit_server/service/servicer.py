"""The gRPC servicer: adapts requests to the core and streams the files. No numerics here.

Errors are translated here and only here: a ValueError from the core becomes INVALID_ARGUMENT
with its message (which starts with the field's path). Every call gets a request id (the
client's ``x-request-id`` or a new one), sent back in the initial metadata and put on every log
line, and is counted in the metrics with its final status.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterator

import crc32c
import grpc
from modelinit_wire import data_message
from modelinit_wire.events import Begin, Data
from modelinit_wire.v1 import modelinit_pb2 as pb
from modelinit_wire.v1 import modelinit_pb2_grpc as pb_grpc

from ..core.planner import Plan
from ..engine.backends import Backend
from ..messages import check_page_size, plan_to_pb
from ..produce import digests, file_bytes, tensor_slices
from .limits import Limits
from .plans import PlanCache
from .observability import Metrics, request_id, request_id_from

log = logging.getLogger("modelinit.server")

@dataclass(frozen=True)
class StreamPolicy:
    """How Init and Tensors streams are bounded (they share the limits)."""

    max_streams: int = 16
    """Init and Tensors streams served at once; one more gets RESOURCE_EXHAUSTED (clients back off and retry
    or go to another replica). Memory per stream is about three 8 MiB segments plus gRPC's
    flow-control window."""
    idle_timeout: float = 60.0
    """Seconds a stream may wait for its client to take the next message before it is ended
    with DEADLINE_EXCEEDED and its buffers freed (a stalled or vanished reader)."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_streams, int) or self.max_streams < 1:
            raise ValueError(f"max_streams: must be an integer >= 1, got {self.max_streams!r}")
        if not self.idle_timeout > 0:
            raise ValueError(f"idle_timeout: must be > 0 seconds, got {self.idle_timeout!r}")


class _Stalled(Exception):
    """The client took nothing for the idle timeout; the message says so."""


class _ClientGone(Exception):
    """The client cancelled the call or its connection dropped: nothing more can be sent."""


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str):
    # Recorded on the context too, so that _observed reads the final status with context.code().
    context.set_code(code)
    context.set_details(message)
    await context.abort(code, message)


def _observed(method):
    """Request id, initial metadata, duration and final status in the metrics, for one rpc."""
    name = method.__name__

    @functools.wraps(method)
    async def wrapper(self: "ModelInitServicer", request, context: grpc.aio.ServicerContext):
        rid = request_id_from(context.invocation_metadata())
        token = request_id.set(rid)
        started = time.monotonic()
        code = grpc.StatusCode.OK
        recorded = False

        def record(code: grpc.StatusCode) -> None:
            nonlocal recorded
            recorded = True
            self._metrics.observe_request(name, code, time.monotonic() - started)
            if code is grpc.StatusCode.INVALID_ARGUMENT:
                self._metrics.rejected("invalid_argument")

        try:
            await context.send_initial_metadata((("x-request-id", rid),))
            return await method(self, request, context)
        except (asyncio.CancelledError, _ClientGone) as e:
            code = grpc.StatusCode.CANCELLED
            log.info("%s cancelled by the client after %.1fs", name, time.monotonic() - started)
            if isinstance(e, asyncio.CancelledError):
                raise
            return None  # the call is over: there is no one to send a status to
        except _Stalled as e:
            # Our buffers and the stream's slot are already released; the status itself waits
            # behind what the client has not read (or goes with the connection).
            code = grpc.StatusCode.DEADLINE_EXCEEDED
            record(code)
            await _abort(context, code, str(e))
        except Exception:
            code = context.code() or grpc.StatusCode.UNKNOWN
            if code is grpc.StatusCode.UNKNOWN:
                log.exception("%s failed", name)
            raise
        finally:
            if not recorded:
                record(code)
            request_id.reset(token)

    return wrapper


class ModelInitServicer(pb_grpc.ModelInitServicer):
    def __init__(
        self,
        backend: Backend,
        generation: Executor,
        *,
        limits: Limits | None = None,
        streams: StreamPolicy | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._backend = backend
        self._generation = generation  # where segments are produced (one thread for parallel kernels)
        self._limits = limits or Limits()
        self._streams = streams or StreamPolicy()
        self._metrics = metrics or Metrics()
        self._inflight = 0
        self._plans = PlanCache()  # recent plans, and recent requests' resolutions for a new seed
        self._digests = digests.Digests()  # the shards hashed whole by this server: never hashed again

    @property
    def inflight(self) -> int:
        """Init and Tensors streams in progress."""
        return self._inflight

    async def _plan(self, msg: pb.ModelRequest, context: grpc.aio.ServicerContext) -> Plan:
        plan = self._plans.cached(msg)  # planned and checked before: no thread hop
        if plan is not None:
            return plan
        try:
            return await asyncio.get_running_loop().run_in_executor(None, self._plans.build, msg, self._limits.check)
        except ValueError as e:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
            raise  # unreachable: abort raises

    @_observed
    async def Plan(self, request: pb.PlanRequest, context: grpc.aio.ServicerContext) -> pb.PlanResponse:
        try:
            check_page_size(request.page_size)  # before the plan is built
        except ValueError as e:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        plan = await self._plan(request.request, context)
        page = functools.partial(plan_to_pb, plan, request.request, request.page_size, request.page_token)
        try:
            return await asyncio.get_running_loop().run_in_executor(None, page)
        except ValueError as e:  # page_token
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
            raise  # unreachable: abort raises

    @contextlib.asynccontextmanager
    async def _stream_slot(self, context: grpc.aio.ServicerContext):
        """One of the --max-streams stream slots for the body; RESOURCE_EXHAUSTED at once when none is free."""
        if self._inflight >= self._streams.max_streams:
            self._metrics.rejected("resource_exhausted")
            await _abort(
                context,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"this server is already serving {self._inflight} streams, its limit (--max-streams); "
                "retry with backoff or use another replica",
            )
        self._inflight += 1
        self._metrics.stream_started()
        try:
            yield
        finally:
            self._inflight -= 1
            self._metrics.stream_finished()

    @_observed
    async def Init(self, request: pb.InitRequest, context: grpc.aio.ServicerContext) -> None:
        async with self._stream_slot(context):
            await self._init(request, context)

    async def _init(self, request: pb.InitRequest, context: grpc.aio.ServicerContext) -> None:
        plan = await self._plan(request.request, context)
        try:
            chunk = tensor_slices.check_chunk(request.chunk_size)
        except ValueError as e:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        selected = list(request.files) or list(range(len(plan.files)))
        bad = [i for i in selected if i >= len(plan.files)]
        if bad:
            await _abort(
                context, grpc.StatusCode.OUT_OF_RANGE, f"files: index {bad[0]} is past the last file ({len(plan.files) - 1})"
            )
        if request.offset > plan.files[selected[0]].size:
            f = plan.files[selected[0]]
            await _abort(context, grpc.StatusCode.OUT_OF_RANGE, f"offset: {request.offset} is past the end of {f.name} ({f.size} bytes)")
        started, sent = time.monotonic(), 0
        log.info("Init %s seed=%d dtype=%s files=%s offset=%d from %s", _describe(request.request), plan.request.seed,
                 plan.request.dtype, selected if request.files else "all", request.offset, context.peer())

        # Ring of 3: one segment is being sent while the next is produced (a third for margin).
        source = file_bytes.events(plan, selected, request.offset, self._backend.fill, ring=3, alloc=self._backend.alloc,
                                   fill_beside=self._backend.fill_beside, digests=self._digests)
        write = functools.partial(self._write, context)
        # The transit check, when asked: a running CRC32C of the file's bytes this stream sends.
        crc: list[int] | None = [0] if request.transit_crc32c else None
        async with contextlib.aclosing(self._one_ahead(source, lambda e: len(e.data) if isinstance(e, Data) else 0)) as events:
            async for event in events:
                if isinstance(event, Data):
                    sent += await self._send(write, event.data, chunk, crc)
                elif isinstance(event, Begin):
                    if crc is not None:
                        crc[0] = 0
                    await write(pb.InitResponse(begin=pb.FileBegin(index=event.index, name=event.name, size=event.size, offset=event.offset)))
                else:
                    await write(pb.InitResponse(end=pb.FileEnd(index=event.index, sha256=event.sha256)))
                    self._metrics.file_done(len(plan.files[event.index].tensors))
        elapsed = time.monotonic() - started
        log.info("Init done: %d bytes in %.1fs (%.0f MB/s)", sent, elapsed, sent / max(elapsed, 1e-9) / 1e6)

    @_observed
    async def Tensors(self, request: pb.TensorsRequest, context: grpc.aio.ServicerContext) -> None:
        # Checked before a stream slot is taken: a bad request costs no slot.
        try:
            chunk = tensor_slices.check_chunk(request.chunk_size)
        except ValueError as e:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        plan = await self._plan(request.request, context)
        try:
            selections = tensor_slices.resume(tensor_slices.select(plan, request), request.start, request.offset, plan.request.dtype)
        except tensor_slices.OutOfRange as e:
            await _abort(context, grpc.StatusCode.OUT_OF_RANGE, str(e))
            raise  # unreachable: abort raises
        except ValueError as e:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
            raise  # unreachable: abort raises
        async with self._stream_slot(context):  # Init and Tensors share --max-streams
            await self._tensors(plan, selections, request.offset, chunk, context, request.transit_crc32c)

    async def _tensors(self, plan: Plan, selections: list[tensor_slices.Selection], offset: int, chunk: int,
                       context: grpc.aio.ServicerContext, transit_crc32c: bool = False) -> None:
        started, sent = time.monotonic(), 0
        log.info("Tensors %d selection(s), %d elements, offset %d, from %s", len(selections),
                 sum(s.numel for s in selections), offset, context.peer())
        source = tensor_slices.blocks(plan, selections, self._backend.fill_runs, offset=offset)
        write = functools.partial(self._write, context)
        crc: list[int] | None = [0] if transit_crc32c else None  # the running CRC32C of the selection's bytes sent
        async with contextlib.aclosing(self._one_ahead(source, lambda b: 0 if isinstance(b, tensor_slices.Selection) else len(b))) as items:
            async for item in items:
                if isinstance(item, tensor_slices.Selection):
                    if crc is not None:
                        crc[0] = 0
                    await write(tensor_slices.begin(plan, item, offset))
                    offset = 0  # only the first selection resumes inside its data
                else:
                    sent += await self._send(write, item, chunk, crc, data_message.TENSORS_CRC32C_TAG)
        elapsed = time.monotonic() - started
        log.info("Tensors done: %d bytes in %.1fs", sent, elapsed)

    async def _one_ahead(self, source: Iterator[Any], nbytes: Callable[[Any], int]) -> AsyncIterator[Any]:
        """The items of generator ``source``, each produced on the generation pool while the one
        before is sent: memory stays at two items. ``nbytes(item)``: the bytes it generated (for
        the metrics). On exit (the end, cancellation, a stalled reader) the item produced ahead is
        dropped and the generator closed, freeing its buffers, once its current step is over."""
        loop = asyncio.get_running_loop()
        metrics = self._metrics
        busy = threading.Lock()  # the generator runs on the generation pool; never two steps at once

        def produce():
            with busy:
                t = time.perf_counter()
                item = next(source, None)
            if item is not None and (n := nbytes(item)):
                metrics.generated(n, time.perf_counter() - t)
            return item

        def close() -> None:
            with busy:
                source.close()

        ahead = loop.run_in_executor(self._generation, produce)
        try:
            while (item := await ahead) is not None:
                ahead = loop.run_in_executor(self._generation, produce)  # the next one while this one is sent
                yield item
        finally:
            ahead.cancel()
            self._generation.submit(close)

    async def _send(self, write, data, chunk: int, crc: list[int] | None = None,
                    crc_tag: int = data_message.CRC32C_TAG) -> int:
        """``data`` (a contiguous buffer) in data messages of at most ``chunk`` bytes, each one's
        wire bytes made in one copy (the same for Init and Tensors; :mod:`.data_messages` registers
        serializers that send them as they are); the bytes sent. ``crc``: the file's running
        CRC32C (a one-element list, advanced here), sent beside each payload (the transit check;
        ``crc_tag``: its field in this stream's response type)."""
        with memoryview(data) as view, view.cast("B") as raw:
            for a in range(0, len(raw), chunk):
                with raw[a : a + chunk] as piece:
                    if crc is None:
                        await write(data_message.encode(piece))
                    else:
                        crc[0] = crc32c.crc32c(piece, crc[0])  # about 14 GB/s: 0.07 ms a message
                        await write(data_message.encode(piece, crc[0], crc_tag))
                    self._metrics.sent(len(piece))
            return len(raw)

    async def _write(self, context: grpc.aio.ServicerContext, message) -> None:
        # A write waits while the client's flow-control window is full: that is the backpressure,
        # and a reader that takes nothing for idle_timeout seconds ends the stream.
        try:
            await asyncio.wait_for(context.write(message), self._streams.idle_timeout)
        except asyncio.TimeoutError:
            log.warning("stream: the client took nothing for %gs; ending the stream", self._streams.idle_timeout)
            raise _Stalled(
                f"the client read nothing for {self._streams.idle_timeout:g}s (--idle-timeout); resume with files and offset (Init), or start and offset (Tensors)"
            ) from None
        except Exception:  # grpc fails a write only when the call is over: cancelled, or its connection gone
            raise _ClientGone() from None


def _describe(msg: pb.ModelRequest) -> str:
    return msg.spec.preset if msg.spec.HasField("preset") else "config.json"
