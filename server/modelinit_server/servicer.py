"""The gRPC servicer: adapts requests to the core and streams the files. No numerics here.

Errors are translated here and only here: a ValueError from the core becomes INVALID_ARGUMENT
with its message (which starts with the field's path).
"""
from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import time
from concurrent.futures import Executor

import grpc
from modelinit.v1 import modelinit_pb2 as pb
from modelinit.v1 import modelinit_pb2_grpc as pb_grpc

from . import files
from .convert import plan_to_pb, request_from_pb
from .planner import Plan, build_plan

log = logging.getLogger("modelinit.server")

MAX_CHUNK = 3 << 20
#: Chunks generated ahead of the one being sent: generation overlaps sending, and memory per
#: stream stays bounded by (PREFETCH + 1) x chunk size.
PREFETCH = 2


class ModelInitServicer(pb_grpc.ModelInitServicer):
    def __init__(self, executor: Executor) -> None:
        self._executor = executor

    async def _plan(self, msg: pb.ModelRequest, context: grpc.aio.ServicerContext) -> Plan:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, lambda: build_plan(request_from_pb(msg)))
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            raise  # unreachable: abort raises

    async def Plan(self, request: pb.PlanRequest, context: grpc.aio.ServicerContext) -> pb.PlanResponse:
        plan = await self._plan(request.request, context)
        return plan_to_pb(plan, request.request)

    async def Init(self, request: pb.InitRequest, context: grpc.aio.ServicerContext):
        plan = await self._plan(request.request, context)
        chunk = request.chunk_size or files.DEFAULT_CHUNK
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
        loop = asyncio.get_running_loop()
        started, sent = time.monotonic(), 0
        log.info("Init %s seed=%d dtype=%s files=%s offset=%d from %s", _describe(request.request), plan.request.seed,
                 plan.request.dtype, selected if request.files else "all", request.offset, context.peer())
        for n, index in enumerate(selected):
            f = plan.files[index]
            offset = request.offset if n == 0 else 0
            yield pb.InitResponse(begin=pb.FileBegin(index=index, name=f.name, size=f.size, offset=offset))
            if offset:
                digest = await loop.run_in_executor(self._executor, files.sha256_prefix, plan, f, offset)
            else:
                digest = hashlib.sha256()
            pending: collections.deque[asyncio.Future[bytes]] = collections.deque()
            starts = iter(range(offset, f.size, chunk))
            try:
                while True:
                    while len(pending) <= PREFETCH:
                        pos = next(starts, None)
                        if pos is None:
                            break
                        end = min(pos + chunk, f.size)
                        pending.append(loop.run_in_executor(self._executor, files.read, plan, f, pos, end))
                    if not pending:
                        break
                    data = await pending.popleft()
                    digest.update(data)
                    sent += len(data)
                    yield pb.InitResponse(data=data)
            finally:
                for fut in pending:  # a cancelled stream drops the chunks generated ahead
                    fut.cancel()
            yield pb.InitResponse(end=pb.FileEnd(index=index, sha256=digest.hexdigest()))
        elapsed = time.monotonic() - started
        log.info("Init done: %d bytes in %.1fs (%.0f MB/s)", sent, elapsed, sent / max(elapsed, 1e-9) / 1e6)


def _describe(msg: pb.ModelRequest) -> str:
    return msg.spec.preset if msg.spec.HasField("preset") else "config.json"
