"""Observability: Prometheus metrics and structured logs carrying a request id. No gRPC wiring here.

Metrics
    :class:`Metrics` owns its own ``CollectorRegistry`` (never the global one), so several servers
    can live in one process (tests do) without clashing. It serves the exposition format on its own
    HTTP port (:meth:`Metrics.serve_http`). The series:

    ``modelinit_requests_total{method, code}``
        finished RPCs; ``method`` is ``Plan``, ``Init`` or ``Tensors`` (the full ``/pkg.Service/Method`` for any
        other service, e.g. health checks), ``code`` the status code's name (``OK``, ...).
    ``modelinit_request_duration_seconds{method}``
        histogram of RPC wall time, 1 ms .. 30 min.
    ``modelinit_inflight_streams``
        Init and Tensors streams in progress.
    ``modelinit_stream_bytes_total``
        file (and Tensors) bytes sent to clients.
    ``modelinit_stream_files_total``, ``modelinit_stream_tensors_total``
        files / tensors completely sent.
    ``modelinit_generated_bytes_total``, ``modelinit_generation_seconds_total``
        bytes produced by the engine and the wall seconds spent producing them. Engine throughput
        (bytes per second of generation) is the ratio of their rates::

            sum(rate(modelinit_generated_bytes_total[5m]))
              / sum(rate(modelinit_generation_seconds_total[5m]))

    ``modelinit_rejected_total{reason}``
        requests refused before any work: ``unauthenticated``, ``resource_exhausted``,
        ``invalid_argument``.
    ``modelinit_build_info{version, engine}``
        always 1; the labels carry the information.

Logs
    :func:`configure_logging` sets up the ``modelinit`` logger hierarchy (never the root logger) as
    text or one JSON object per line (:class:`JsonFormatter`). Each record carries the request id
    of the RPC it was logged from: the server sets :data:`request_id` (from the client's
    ``x-request-id`` header, see :func:`request_id_from`) in the RPC's task, and
    :class:`RequestIdFilter` copies it onto the record.
"""
from __future__ import annotations

import contextlib
import contextvars
import datetime
import json
import logging
import math
import re
import sys
import threading
import uuid
from collections.abc import Iterable, Iterator
from typing import IO, Any

import grpc
import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# The modelinit service's method prefix: its methods are labelled by their short name.
SERVICE_PREFIX = "/modelinit.v1.ModelInit/"

# From a fast Plan (a millisecond) to a whole large model streamed (tens of minutes).
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0)

REJECT_REASONS = ("unauthenticated", "resource_exhausted", "invalid_argument")

_CODES_BY_VALUE = {c.value[0]: c for c in grpc.StatusCode}


def code_name(code: grpc.StatusCode | str | int | None) -> str:
    """The status code's name as a label: ``grpc.StatusCode.NOT_FOUND``, ``"not_found"`` and ``5``
    all give ``"NOT_FOUND"``. ``None`` (what grpc.aio reports when a handler set no code) is ``OK``."""
    if code is None:
        return "OK"
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(code, int) and not isinstance(code, bool):
        known = _CODES_BY_VALUE.get(code)
        return known.name if known else str(code)
    name = str(code).strip()
    name = name.removeprefix("StatusCode.")
    return name.upper() if name.upper() in grpc.StatusCode.__members__ else name


def method_label(method: str) -> str:
    """``/modelinit.v1.ModelInit/Plan`` -> ``Plan``; other services' methods stay whole."""
    return method[len(SERVICE_PREFIX):] if method.startswith(SERVICE_PREFIX) else method


class Metrics:
    """The server's Prometheus series, in a registry of their own. Thread-safe."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # prometheus_client appends `_total` to counter names itself.
        self._requests = Counter("modelinit_requests", "Finished RPCs by method and status code.",
                                 ("method", "code"), registry=r)
        self._duration = Histogram("modelinit_request_duration_seconds", "RPC wall time in seconds.",
                                   ("method",), buckets=DURATION_BUCKETS, registry=r)
        self._inflight = Gauge("modelinit_inflight_streams", "Init streams in progress.", registry=r)
        self._bytes = Counter("modelinit_stream_bytes", "File bytes sent to clients.", registry=r)
        self._files = Counter("modelinit_stream_files", "Files completely sent.", registry=r)
        self._tensors = Counter("modelinit_stream_tensors", "Tensors completely sent.", registry=r)
        self._generated = Counter("modelinit_generated_bytes", "Bytes produced by the engine.", registry=r)
        self._generation = Counter("modelinit_generation_seconds",
                                   "Wall seconds the engine spent producing bytes.", registry=r)
        self._rejected = Counter("modelinit_rejected", "Requests refused before any work, by reason.",
                                 ("reason",), registry=r)
        self._build = Gauge("modelinit_build_info", "Server version and engine; always 1.",
                            ("version", "engine"), registry=r)
        # Known reasons exist from the start at 0, so rate() and alerts see them before the first one.
        for reason in REJECT_REASONS:
            self._rejected.labels(reason=reason)
        self._http: tuple[Any, threading.Thread] | None = None
        self._http_lock = threading.Lock()

    # -- recording

    def observe_request(self, method: str, code: grpc.StatusCode | str, seconds: float) -> None:
        """One finished RPC: ``method`` short (``Plan``) or full (``/modelinit.v1.ModelInit/Plan``)."""
        m = method_label(method)
        self._requests.labels(method=m, code=code_name(code)).inc()
        self._duration.labels(method=m).observe(max(0.0, seconds))

    def stream_started(self) -> None:
        self._inflight.inc()

    def stream_finished(self) -> None:
        self._inflight.dec()

    @contextlib.contextmanager
    def inflight(self) -> Iterator[None]:
        """Count an Init stream as in progress for the duration of the block, however it ends."""
        self.stream_started()
        try:
            yield
        finally:
            self.stream_finished()

    def sent(self, nbytes: int) -> None:
        """File bytes handed to the client (a chunk of a response)."""
        self._bytes.inc(nbytes)

    def file_done(self, tensors: int) -> None:
        """A file completely sent, holding ``tensors`` tensors."""
        self._files.inc()
        self._tensors.inc(tensors)

    def generated(self, nbytes: int, seconds: float) -> None:
        """The engine produced ``nbytes`` in ``seconds`` of wall time."""
        self._generated.inc(nbytes)
        self._generation.inc(max(0.0, seconds))

    def rejected(self, reason: str) -> None:
        """A request refused before work; ``reason`` should be one of :data:`REJECT_REASONS`."""
        self._rejected.labels(reason=reason).inc()

    def set_build_info(self, version: str, engine: str) -> None:
        # One series only: a changed engine replaces the old labels instead of adding to them.
        self._build.clear()
        self._build.labels(version=str(version), engine=str(engine)).set(1)

    # -- reading (tests, diagnostics)

    def value(self, name: str, **labels: str) -> float:
        """A sample's current value by its exposed name (``modelinit_requests_total``,
        ``modelinit_request_duration_seconds_count``, ...); 0.0 when no such series exists yet
        (a labelled counter is only created by its first increment)."""
        v = self.registry.get_sample_value(name, labels or None)
        return 0.0 if v is None else v

    # -- exposition

    def serve_http(self, port: int, host: str = "0.0.0.0") -> int:
        """Serve ``/metrics`` on a daemon thread at ``host`` (an interface address without
        brackets: ``127.0.0.1``, ``::``, ``0.0.0.0``); returns the bound port (the real one for
        port 0). RuntimeError if already serving; OSError if the port is taken."""
        with self._http_lock:
            if self._http is not None:
                raise RuntimeError("metrics HTTP server already running; stop_http() first")
            server, thread = prometheus_client.start_http_server(port, addr=host, registry=self.registry)
            self._http = (server, thread)
            return server.server_port

    @property
    def http_address(self) -> tuple[str, int] | None:
        """(interface, port) the endpoint listens on; None when not serving."""
        with self._http_lock:
            return None if self._http is None else tuple(self._http[0].server_address[:2])

    def stop_http(self) -> None:
        """Stop the HTTP server and free its port; a no-op when not serving."""
        with self._http_lock:
            if self._http is None:
                return
            server, thread = self._http
            self._http = None
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


# -- logs

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("modelinit_request_id", default="-")
"""The current RPC's request id; ``-`` outside any RPC."""

REQUEST_ID_HEADER = "x-request-id"
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def request_id_from(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    """The client's ``x-request-id`` when it is a safe token (``[A-Za-z0-9._:-]``, 1..64 characters:
    it goes into every log line), else a fresh random id (32 hex digits)."""
    for key, value in metadata or ():
        if key.lower() != REQUEST_ID_HEADER:
            continue
        if isinstance(value, bytes):
            value = value.decode("ascii", "replace")
        # fullmatch: `$` would let a trailing newline through.
        if isinstance(value, str) and _REQUEST_ID.fullmatch(value):
            return value
        break  # the first header decides; an invalid one is not an invitation to try others
    return uuid.uuid4().hex


class RequestIdFilter(logging.Filter):
    """Puts the current request id on every record as ``record.request_id``. Attach it to handlers
    (logger filters do not see records propagated from child loggers). An explicit
    ``extra={"request_id": ...}`` is left as given."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_id.get()
        return True


# Attributes every LogRecord has; anything else on a record came from the caller's `extra=`.
_RECORD_ATTRS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "request_id", "taskName"}


def _scalar(value: Any) -> Any:
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)  # NaN/Infinity are not JSON
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (RFC 3339, UTC, milliseconds), ``level``, ``logger``, ``msg``,
    ``request_id``, the caller's ``extra=`` fields (non-JSON values as ``str``; a field named like
    one of the fixed ones is dropped), and ``exc`` / ``stack`` when there are any."""

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
        out: dict[str, Any] = {}
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRS and not key.startswith("_"):
                out[key] = _scalar(value)
        out.update(
            ts=ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            level=record.levelname,
            logger=record.name,
            msg=record.getMessage(),
            request_id=str(getattr(record, "request_id", None) or request_id.get()),
        )
        out.pop("exc", None)
        out.pop("stack", None)
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"
LOG_FORMATS = ("text", "json")


def configure_logging(fmt: str = "text", level: str | int = "INFO", stream: IO[str] | None = None) -> None:
    """Log the ``modelinit`` hierarchy to ``stream`` (stderr by default) as ``text`` or ``json``.
    Calling it again replaces the handler it installed before. The root logger is left alone
    (records still propagate to it, so an application that configured root sees them too)."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log_format: {fmt!r} is not one of {', '.join(LOG_FORMATS)}")
    if isinstance(level, str):
        resolved = logging.getLevelName(level.strip().upper())
        if not isinstance(resolved, int):
            raise ValueError(f"log_level: {level!r} is not a logging level (DEBUG, INFO, WARNING, ERROR, CRITICAL)")
        level = resolved
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler._modelinit = True  # marks the handler as ours, for the next call to replace
    logger = logging.getLogger("modelinit")
    for old in [h for h in logger.handlers if getattr(h, "_modelinit", False)]:
        logger.removeHandler(old)
        old.close()  # StreamHandler.close does not close the stream itself
    logger.addHandler(handler)
    logger.setLevel(level)
