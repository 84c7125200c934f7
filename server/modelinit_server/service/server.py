"""Server lifecycle: build the grpc.aio server, health checking, serve until SIGTERM/SIGINT."""
from __future__ import annotations

import asyncio
import errno
import logging
import signal
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from modelinit_host.heap import keep_large_blocks
from modelinit_wire.v1 import modelinit_pb2

from .. import __version__
from ..engine.backends import DEVICES, Backend, select
from modelinit_host.usable_cores import usable_cores
from . import data_messages
from .limits import Limits
from .malformed import MalformedRequestInterceptor
from .observability import Metrics
from .security import TokenAuthInterceptor, check_tls_args, load_server_credentials, load_token
from .servicer import ModelInitServicer, StreamPolicy

log = logging.getLogger("modelinit.server")

SERVICE_NAME = modelinit_pb2.DESCRIPTOR.services_by_name["ModelInit"].full_name


@dataclass(frozen=True)
class ServerConfig:
    """How to run the server. Every field has a ``modelinit serve`` flag of the same name."""

    host: str = "[::]"
    """Interface to bind; ``[::]`` is every interface, ``127.0.0.1`` loopback only."""
    port: int = 50051
    """TCP port; 0 picks a free one (the bound port is reported)."""
    device: str = "auto"
    """``auto`` (CUDA when present, else the numba CPU kernel), ``cpu``, ``cuda``, or ``reference``
    (the slow numpy reference engine, for debugging). Every device gives the same bytes."""
    workers: int = 0
    """Threads for the reference engine; 0 means the usable cores (affinity, cgroup quota; the numba and CUDA
    kernels parallelize internally and run one segment at a time)."""
    grace: float = 30.0
    """Seconds in-flight streams get to finish on SIGTERM; then they end with UNAVAILABLE and
    clients resume elsewhere."""
    shutdown_delay: float = 0.0
    """Seconds between SIGTERM and no longer accepting calls, while health already says
    NOT_SERVING: time for load balancers and Kubernetes endpoints to stop sending new calls."""
    limits: Limits = field(default_factory=Limits)
    """Caps on what one request may ask for."""
    streams: StreamPolicy = field(default_factory=StreamPolicy)
    """Concurrent streams and the stalled-reader timeout."""
    tls_cert: str | None = None
    """PEM certificate chain; with ``tls_key`` the server speaks TLS only. None: plaintext."""
    tls_key: str | None = None
    """PEM private key of ``tls_cert``."""
    tls_client_ca: str | None = None
    """PEM CA bundle; clients must present a certificate it signed (mutual TLS)."""
    token: str | None = None
    """Bearer token every call but health checks must carry (``authorization: Bearer ...``);
    ``@PATH`` reads it from a file (a mounted secret). None: no token needed."""
    metrics_port: int | None = None
    """Port of the Prometheus ``/metrics`` endpoint (plain HTTP, its own port); 0 picks a free
    one; None: no endpoint."""
    metrics_host: str | None = None
    """Interface of the metrics endpoint; None: the same as ``host`` (so ``127.0.0.1`` keeps
    metrics on loopback too; ``[::]`` is every interface, IPv4 as well)."""
    reflection: bool = False
    """Serve gRPC server reflection (for grpcurl and similar tools)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: {self.port} is not in 0..65535")
        if self.device not in DEVICES:
            raise ValueError(f"device: {self.device!r} is not one of {', '.join(DEVICES)}")
        if self.workers < 0:
            raise ValueError(f"workers: must be >= 0, got {self.workers}")
        if self.grace < 0:
            raise ValueError(f"grace: must be >= 0 seconds, got {self.grace}")
        if self.shutdown_delay < 0:
            raise ValueError(f"shutdown_delay: must be >= 0 seconds, got {self.shutdown_delay}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port: {self.metrics_port} is not in 0..65535")
        check_tls_args(self.tls_cert, self.tls_key, self.tls_client_ca)


#: Server-side keepalive: notice a client whose machine vanished (no FIN/RST) within ~40 s.
#: No SO_REUSEPORT (gRPC sets it by default): a second server on a busy port must fail to start,
#: not silently share the port and take half of the first one's connections.
_SERVER_OPTIONS = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.so_reuseport", 0),
]


def _bind_failure(host: str, port: int) -> OSError | None:
    """What binding a plain socket at ``host:port`` raises (None: it binds). It tells why gRPC
    cannot bind there: gRPC's own error says only "Failed to bind", after logging to stderr."""
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM,
                                                              flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does: TIME_WAIT is no conflict
            s.bind(sockaddr)
    except OSError as e:  # socket.gaierror included
        return e
    return None


def _port_error(host: str, port: int, failure: OSError | None) -> OSError:
    """The one-line error of a gRPC port that could not be bound, ``failure`` saying why."""
    address = f"{host}:{port}"
    if failure is not None and failure.errno == errno.EADDRINUSE:
        return OSError(f"port {address} is already in use; stop what listens there or choose another --port")
    why = f" ({failure.strerror or failure})" if failure is not None else ""
    return OSError(f"cannot bind port {address}{why}; check --host and --port")


def metrics_interface(config: ServerConfig) -> str:
    """Where the metrics endpoint listens: ``metrics_host``, else ``host`` (without brackets)."""
    host = config.metrics_host if config.metrics_host is not None else config.host
    return host.strip("[]") or "::"


def _serve_metrics(metrics: Metrics, config: ServerConfig) -> int:
    """Start the metrics endpoint; OSError with a one-line reason when its port cannot be bound."""
    host, port = metrics_interface(config), config.metrics_port
    assert port is not None
    try:
        return metrics.serve_http(port, host)
    except OSError as e:
        if host == "::" and e.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
            return metrics.serve_http(port, "0.0.0.0")  # no IPv6 on this machine: every IPv4 interface
        if e.errno == errno.EADDRINUSE:
            raise OSError(f"metrics port {host}:{port} is already in use; stop what listens there or choose "
                          "another --metrics-port") from None
        raise OSError(f"cannot bind metrics port {host}:{port}: {e.strerror or e}") from None


class Running:
    """A started server: its port, its backend, metrics, and how to stop it."""

    def __init__(self, server: grpc.aio.Server, port: int, backend: Backend, health_servicer: health.aio.HealthServicer,
                 executor: ThreadPoolExecutor, servicer: ModelInitServicer, metrics: Metrics, metrics_port: int | None):
        self.server, self.port, self.backend = server, port, backend
        self.servicer, self.metrics, self.metrics_port = servicer, metrics, metrics_port
        self._health, self._executor = health_servicer, executor

    async def stop(self, grace: float | None, delay: float = 0.0) -> None:
        """Health -> NOT_SERVING, wait ``delay`` seconds (still serving), stop accepting calls,
        give in-flight ones ``grace`` seconds, then cancel them."""
        await self._health.enter_graceful_shutdown()
        if delay:
            await asyncio.sleep(delay)
        await self.server.stop(grace)
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self.metrics_port is not None:
            self.metrics.stop_http()


async def start(config: ServerConfig) -> Running:
    """Start serving; ValueError for a bad configuration (unavailable device, unreadable TLS
    files, empty token), OSError with a one-line reason if a port cannot be bound (taken: gRPC's
    SO_REUSEPORT is off, so a second server on one port fails here instead of sharing it)."""
    keep_large_blocks()  # the first stream faulted every message's pages in otherwise (modelinit_host.heap)
    backend = select(config.device, warmup=True)
    credentials = load_server_credentials(config.tls_cert, config.tls_key, config.tls_client_ca) if config.tls_cert else None
    token = load_token(config.token) if config.token is not None else None
    metrics = Metrics()
    metrics.set_build_info(__version__, backend.name)
    interceptors: list[grpc.aio.ServerInterceptor] = []
    if token:  # first: an unauthenticated caller learns nothing, not even that its request was malformed
        interceptors.append(TokenAuthInterceptor(token, on_reject=lambda _m: metrics.rejected("unauthenticated")))
    interceptors.append(MalformedRequestInterceptor(metrics))
    threads = 1 if backend.parallel else (config.workers or usable_cores())
    executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="modelinit-gen")
    options = _SERVER_OPTIONS + [("grpc.max_receive_message_length", config.limits.max_request_bytes)]
    server = grpc.aio.server(interceptors=interceptors, options=options)
    servicer = ModelInitServicer(backend, executor, limits=config.limits, streams=config.streams, metrics=metrics)
    data_messages.add_servicer(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if config.reflection:
        # v1alpha only: grpcio-reflection ships no grpc.reflection.v1 service (docs/operations.md);
        # clients such as grpcurl fall back to it.
        from grpc_reflection.v1alpha import reflection

        reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    address = f"{config.host}:{config.port}"
    # A port in use is told before gRPC tries (and logs its own error); any other failure is left
    # to gRPC, which binds [::] as 0.0.0.0 on a machine without IPv6.
    taken = _bind_failure(config.host, config.port) if config.port else None
    port = 0
    if taken is None or taken.errno != errno.EADDRINUSE:
        try:
            port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
        except RuntimeError:  # "Failed to bind to address ..."
            port = 0
    if port == 0:
        executor.shutdown(wait=False)
        raise _port_error(config.host, config.port, taken or _bind_failure(config.host, config.port))
    try:
        metrics_port = _serve_metrics(metrics, config) if config.metrics_port is not None else None
    except OSError:
        await server.stop(None)
        executor.shutdown(wait=False)
        raise
    await server.start()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return Running(server, port, backend, health_servicer, executor, servicer, metrics, metrics_port)


def serve(config: ServerConfig, ready=print) -> None:
    """Serve until SIGTERM or SIGINT, then drain in-flight streams for ``config.grace`` seconds."""

    async def main() -> None:
        running = await start(config)
        extra = f", metrics on :{running.metrics_port}/metrics" if running.metrics_port is not None else ""
        tls = "TLS" if config.tls_cert else "plaintext"
        ready(f"modelinit: serving on {config.host}:{running.port} ({tls}, engine {running.backend.name}{extra})")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("shutting down: health NOT_SERVING, %d stream(s) in flight, delay %.1fs, grace %.0fs",
                 running.servicer.inflight, config.shutdown_delay, config.grace)
        await running.stop(config.grace, config.shutdown_delay)
        log.info("stopped")

    asyncio.run(main())


class BackgroundServer:
    """A real server on a loopback port, on its own thread and event loop, inside this process:
    for tests and for applications that want to serve from their own process. (The embedded
    ``modelinit.Client()`` needs no server: it uses :class:`modelinit_server.service.embedded.EmbeddedService`.)
    """

    def __init__(self, config: ServerConfig | None = None) -> None:
        config = config or ServerConfig(host="127.0.0.1", port=0)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="modelinit-embedded", daemon=True)
        self._thread.start()
        try:
            self._running = asyncio.run_coroutine_threadsafe(start(config), self._loop).result()
        except BaseException:  # e.g. the port is taken: leave no thread or loop behind
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
            raise
        self.target = f"127.0.0.1:{self._running.port}"

    @property
    def running(self) -> Running:
        """The started server (port, servicer with its in-flight count, metrics)."""
        return self._running

    def stop(self) -> None:
        if self._loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self._running.stop(None), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
