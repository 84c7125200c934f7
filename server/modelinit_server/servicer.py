"""The gRPC servicer: adapts requests to the core and streams the files. No numerics here.

Errors are translated here and only here: a ValueError from the core becomes INVALID_ARGUMENT
with its message (which starts with the field's path).
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor

import grpc
from modelinit.events import Begin, Data
from modelinit.v1 import modelinit_pb2 as pb
from modelinit.v1 import modelinit_pb2_grpc as pb_grpc

from . import files
from .convert import plan_to_pb, request_from_pb
from .engine.backends import Backend
from .planner import Plan, build_plan

log = logging.getLogger("modelinit.server")

DEFAULT_CHUNK = 1 << 20
MAX_CHUNK = 3 << 20


class ModelInitServicer(pb_grpc.ModelInitServicer):
    def __init__(self, backend: Backend, generation: Executor) -> None:
        self._backend = backend
        self._generation = generation  # where segments are produced (one thread for parallel kernels)

    async def _plan(self, msg: pb.ModelRequest, context: grpc.aio.ServicerContext) -> Plan:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(None, lambda: build_plan(request_from_pb(msg)))
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            raise  # unreachable: abort raises

    async def Plan(self, request: pb.PlanRequest, context: grpc.aio.ServicerContext) -> pb.PlanResponse:
        plan = await self._plan(request.request, context)
        return plan_to_pb(plan, request.request)

    async def Init(self, request: pb.InitRequest, context: grpc.aio.ServicerContext):
        plan = await self._plan(request.request, context)
        chunk = request.chunk_size or DEFAULT_CHUNK
        if chunk > MAX_CHUNK:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"chunk_size: {chunk} bytes is over the {MAX_CHUNK}-byte maximum; use 1048576 or 0"
            )
        selected = list(request.files) or list(range(len(plan.files)))
        bad = [i for i in selected if i >= len(plan.files)]
        if bad:
            await context.abort(
                grpc.StatusCode.OUT_OF_RANGE, f"files: index {bad[0]} is past the last file ({len(plan.files) - 1})"
            )
        if request.offset > plan.files[selected[0]].size:
            f = plan.files[selected[0]]
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, f"offset: {request.offset} is past the end of {f.name} ({f.size} bytes)")
        started, sent = time.monotonic(), 0
        log.info("Init %s seed=%d dtype=%s files=%s offset=%d from %s", _describe(request.request), plan.request.seed,
                 plan.request.dtype, selected if request.files else "all", request.offset, context.peer())

        loop = asyncio.get_running_loop()
        # Ring of 3: one segment is being sent while the next is produced (a third for margin).
        source = files.events(plan, selected, request.offset, self._backend.fill, ring=3)
        ahead = loop.run_in_executor(self._generation, next, source, None)
        try:
            while (event := await ahead) is not None:
                # Produce the next segment while this one is sent: memory stays at two segments.
                ahead = loop.run_in_executor(self._generation, next, source, None)
                if isinstance(event, Data):
                    data = event.data
                    for a in range(0, len(data), chunk):
                        piece = data[a : a + chunk].tobytes()
                        sent += len(piece)
                        yield pb.InitResponse(data=piece)
                elif isinstance(event, Begin):
                    yield pb.InitResponse(begin=pb.FileBegin(index=event.index, name=event.name, size=event.size, offset=event.offset))
                else:
                    yield pb.InitResponse(end=pb.FileEnd(index=event.index, sha256=event.sha256))
        finally:
            # On cancellation: drop the segment produced ahead; close the generator once it is idle.
            if ahead.cancel() or ahead.done():
                source.close()
            else:
                ahead.add_done_callback(lambda _: source.close())
        elapsed = time.monotonic() - started
        log.info("Init done: %d bytes in %.1fs (%.0f MB/s)", sent, elapsed, sent / max(elapsed, 1e-9) / 1e6)


def _describe(msg: pb.ModelRequest) -> str:
    return msg.spec.preset if msg.spec.HasField("preset") else "config.json"
