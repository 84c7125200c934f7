"""Server lifecycle: build the grpc.aio server, health checking, serve until SIGTERM/SIGINT."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from modelinit.v1 import modelinit_pb2, modelinit_pb2_grpc

from .engine.backends import DEVICES, Backend, select
from .servicer import ModelInitServicer

log = logging.getLogger("modelinit.server")

SERVICE_NAME = modelinit_pb2.DESCRIPTOR.services_by_name["ModelInit"].full_name


@dataclass(frozen=True)
class ServerConfig:
    """How to run the server."""

    host: str = "[::]"
    """Interface to bind; ``[::]`` is every interface, ``127.0.0.1`` loopback only."""
    port: int = 50051
    """TCP port; 0 picks a free one (the bound port is reported)."""
    device: str = "auto"
    """``auto`` (CUDA when present, else the numba CPU kernel), ``cpu``, ``cuda``, or ``reference``
    (the slow numpy reference engine, for debugging). Every device gives the same bytes."""
    workers: int = 0
    """Threads for the reference engine; 0 means the machine's CPU count (the numba and CUDA
    kernels parallelize internally and run one segment at a time)."""
    grace: float = 30.0
    """Seconds in-flight streams get to finish on SIGTERM."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: {self.port} is not in 0..65535")
        if self.device not in DEVICES:
            raise ValueError(f"device: {self.device!r} is not one of {', '.join(DEVICES)}")
        if self.workers < 0:
            raise ValueError(f"workers: must be >= 0, got {self.workers}")
        if self.grace < 0:
            raise ValueError(f"grace: must be >= 0 seconds, got {self.grace}")


class Running:
    """A started server: its port, its backend, and how to stop it."""

    def __init__(self, server: grpc.aio.Server, port: int, backend: Backend,
                 health_servicer: health.aio.HealthServicer, executor: ThreadPoolExecutor):
        self.server, self.port, self.backend, self._health, self._executor = server, port, backend, health_servicer, executor

    async def stop(self, grace: float | None) -> None:
        await self._health.enter_graceful_shutdown()
        await self.server.stop(grace)
        self._executor.shutdown(wait=False, cancel_futures=True)


async def start(config: ServerConfig) -> Running:
    """Start serving; ValueError if the device's backend is unavailable, OSError if the port is taken."""
    backend = select(config.device, warmup=True)
    threads = 1 if backend.parallel else (config.workers or os.cpu_count() or 1)
    executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="modelinit-gen")
    server = grpc.aio.server()
    modelinit_pb2_grpc.add_ModelInitServicer_to_server(ModelInitServicer(backend, executor), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port(f"{config.host}:{config.port}")
    if port == 0:
        raise OSError(f"could not bind {config.host}:{config.port}")
    await server.start()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return Running(server, port, backend, health_servicer, executor)


def serve(config: ServerConfig, ready=print) -> None:
    """Serve until SIGTERM or SIGINT, then drain in-flight streams for ``config.grace`` seconds."""

    async def main() -> None:
        running = await start(config)
        ready(f"modelinit: serving on {config.host}:{running.port} (engine {running.backend.name})")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("draining (grace %.0fs)", config.grace)
        await running.stop(config.grace)

    asyncio.run(main())


class EmbeddedServer:
    """A real server on a loopback port, on its own thread and event loop, inside this process:
    for tests and for applications that want to serve from their own process. (The embedded
    ``modelinit.Client()`` needs no server: it uses :class:`modelinit_server.local.LocalEngine`.)
    """

    def __init__(self, config: ServerConfig | None = None) -> None:
        config = config or ServerConfig(host="127.0.0.1", port=0)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="modelinit-embedded", daemon=True)
        self._thread.start()
        self._running = asyncio.run_coroutine_threadsafe(start(config), self._loop).result()
        self.target = f"127.0.0.1:{self._running.port}"

    def stop(self) -> None:
        if self._loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self._running.stop(None), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
