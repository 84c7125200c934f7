"""Metrics and structured logs (modelinit_server.service.observability), without a gRPC server."""
from __future__ import annotations

import contextvars
import io
import json
import logging
import re
import sys
import urllib.error
import urllib.request

import grpc
import pytest
from modelinit_server.service import observability as obs
from modelinit_server.service.observability import (
    JsonFormatter,
    Metrics,
    RequestIdFilter,
    code_name,
    configure_logging,
    request_id,
    request_id_from,
)
from modelinit_wire.v1 import modelinit_pb2

HEX32 = re.compile(r"[0-9a-f]{32}")


# -- metrics


def test_service_prefix_matches_the_proto():
    full = modelinit_pb2.DESCRIPTOR.services_by_name["ModelInit"].full_name
    assert obs.SERVICE_PREFIX == f"/{full}/"


def test_code_name():
    assert code_name(grpc.StatusCode.INVALID_ARGUMENT) == "INVALID_ARGUMENT"
    assert code_name("ok") == "OK"
    assert code_name("StatusCode.NOT_FOUND") == "NOT_FOUND"
    assert code_name(14) == "UNAVAILABLE"
    assert code_name(None) == "OK"


def test_requests_and_duration():
    m = Metrics()
    m.observe_request("Plan", grpc.StatusCode.OK, 0.004)
    m.observe_request("/modelinit.v1.ModelInit/Plan", "OK", 0.2)
    m.observe_request("Init", grpc.StatusCode.INVALID_ARGUMENT, 0.001)
    m.observe_request("/grpc.health.v1.Health/Check", grpc.StatusCode.OK, 0.0005)
    assert m.value("modelinit_requests_total", method="Plan", code="OK") == 2
    assert m.value("modelinit_requests_total", method="Init", code="INVALID_ARGUMENT") == 1
    assert m.value("modelinit_requests_total", method="/grpc.health.v1.Health/Check", code="OK") == 1
    assert m.value("modelinit_requests_total", method="Init", code="OK") == 0
    assert m.value("modelinit_request_duration_seconds_count", method="Plan") == 2
    assert m.value("modelinit_request_duration_seconds_sum", method="Plan") == pytest.approx(0.204)
    assert m.value("modelinit_request_duration_seconds_bucket", method="Plan", le="0.005") == 1
    assert m.value("modelinit_request_duration_seconds_bucket", method="Plan", le="0.25") == 2
    assert m.value("modelinit_request_duration_seconds_bucket", method="Plan", le="1800.0") == 2


def test_inflight_gauge():
    m = Metrics()
    assert m.value("modelinit_inflight_streams") == 0
    m.stream_started()
    with m.inflight():
        assert m.value("modelinit_inflight_streams") == 2
    m.stream_finished()
    assert m.value("modelinit_inflight_streams") == 0
    with pytest.raises(RuntimeError), m.inflight():
        assert m.value("modelinit_inflight_streams") == 1
        raise RuntimeError("stream failed")
    assert m.value("modelinit_inflight_streams") == 0  # an aborted stream is no longer in flight


def test_stream_and_generation_counters():
    m = Metrics()
    m.sent(1 << 20)
    m.sent(100)
    m.file_done(tensors=7)
    m.file_done(tensors=3)
    m.generated(4096, 0.5)
    m.generated(4096, 1.5)
    assert m.value("modelinit_stream_bytes_total") == (1 << 20) + 100
    assert m.value("modelinit_stream_files_total") == 2
    assert m.value("modelinit_stream_tensors_total") == 10
    assert m.value("modelinit_generated_bytes_total") == 8192
    assert m.value("modelinit_generation_seconds_total") == 2.0


def test_rejected_and_build_info():
    m = Metrics()
    # Known reasons are exposed at 0 before the first rejection.
    assert m.registry.get_sample_value("modelinit_rejected_total", {"reason": "unauthenticated"}) == 0
    m.rejected("unauthenticated")
    m.rejected("resource_exhausted")
    m.rejected("resource_exhausted")
    assert m.value("modelinit_rejected_total", reason="unauthenticated") == 1
    assert m.value("modelinit_rejected_total", reason="resource_exhausted") == 2
    assert m.value("modelinit_rejected_total", reason="invalid_argument") == 0
    m.set_build_info("0.1.0", "cpu")
    m.set_build_info("0.1.0", "cuda")  # replaces, does not add a second series
    assert m.value("modelinit_build_info", version="0.1.0", engine="cuda") == 1
    assert m.registry.get_sample_value("modelinit_build_info", {"version": "0.1.0", "engine": "cpu"}) is None


def test_instances_are_independent():
    a, b = Metrics(), Metrics()
    a.sent(10)
    a.observe_request("Init", "OK", 1.0)
    a.stream_started()
    assert a.value("modelinit_stream_bytes_total") == 10
    assert b.value("modelinit_stream_bytes_total") == 0
    assert b.value("modelinit_requests_total", method="Init", code="OK") == 0
    assert b.value("modelinit_inflight_streams") == 0
    assert a.registry is not b.registry


def test_serve_http_exposes_the_series():
    m = Metrics()
    m.set_build_info("9.9.9", "reference")
    m.observe_request("Plan", grpc.StatusCode.OK, 0.01)
    m.sent(1234)
    port = m.serve_http(0, host="127.0.0.1")
    try:
        assert port > 0
        with pytest.raises(RuntimeError):
            m.serve_http(0, host="127.0.0.1")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as r:
            assert r.status == 200
            text = r.read().decode()
    finally:
        m.stop_http()
    assert 'modelinit_requests_total{code="OK",method="Plan"} 1.0' in text
    assert "modelinit_stream_bytes_total 1234.0" in text
    assert 'modelinit_build_info{engine="reference",version="9.9.9"} 1.0' in text
    assert "modelinit_inflight_streams 0.0" in text
    assert 'modelinit_rejected_total{reason="invalid_argument"} 0.0' in text
    for name in ("modelinit_request_duration_seconds_bucket", "modelinit_stream_files_total",
                 "modelinit_stream_tensors_total", "modelinit_generated_bytes_total",
                 "modelinit_generation_seconds_total"):
        assert f"\n{name}" in text, name
    with pytest.raises(urllib.error.URLError):  # the port is closed
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60)
    m.stop_http()  # stopping twice is harmless


# -- request ids


def test_request_id_from_takes_a_valid_header():
    assert request_id_from([("x-request-id", "abc-123.def:4_5")]) == "abc-123.def:4_5"
    assert request_id_from((("user-agent", "grpc"), ("X-Request-Id", "A1"))) == "A1"
    assert request_id_from([("x-request-id", "a" * 64)]) == "a" * 64


@pytest.mark.parametrize("bad", ["a" * 65, "has space", "line\n", "new\nline", "", "quote\"", "ünï"])
def test_request_id_from_rejects_invalid(bad):
    got = request_id_from([("x-request-id", bad)])
    assert got != bad and HEX32.fullmatch(got)


@pytest.mark.parametrize("metadata", [None, (), [("authorization", "Bearer x")]])
def test_request_id_from_generates(metadata):
    a, b = request_id_from(metadata), request_id_from(metadata)
    assert HEX32.fullmatch(a) and HEX32.fullmatch(b) and a != b


# -- logs


def _record(msg="hello %s", args=("world",), exc_info=None, **extra):
    logger = logging.getLogger("modelinit.test")
    record = logger.makeRecord(logger.name, logging.WARNING, __file__, 1, msg, args, exc_info, extra=extra or None)
    RequestIdFilter().filter(record)
    return record


def test_json_formatter_fields():
    record = _record(model="llama", files=3, ratio=0.5, ok=True, nothing=None, shape=(2, 3))
    line = JsonFormatter().format(record)
    assert "\n" not in line
    out = json.loads(line)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", out["ts"])
    assert out["level"] == "WARNING"
    assert out["logger"] == "modelinit.test"
    assert out["msg"] == "hello world"
    assert out["request_id"] == "-"  # outside any request
    assert out["model"] == "llama" and out["files"] == 3 and out["ratio"] == 0.5
    assert out["ok"] is True and out["nothing"] is None
    assert out["shape"] == "(2, 3)"  # not JSON: str()
    assert "exc" not in out
    assert "args" not in out and "levelno" not in out  # LogRecord internals stay out


def test_json_formatter_escapes():
    out = json.loads(JsonFormatter().format(_record('quote " newline \n tab \t', (), note="a\"b\nc")))
    assert out["msg"] == 'quote " newline \n tab \t'
    assert out["note"] == "a\"b\nc"


def test_json_formatter_exception():
    try:
        raise KeyError("boom")
    except KeyError:
        record = _record("failed", (), exc_info=sys.exc_info())
    out = json.loads(JsonFormatter().format(record))
    assert out["msg"] == "failed"
    assert out["exc"].startswith("Traceback") and "KeyError: 'boom'" in out["exc"]


def test_request_id_comes_from_the_context():
    def in_request():
        request_id.set("req-42")
        return json.loads(JsonFormatter().format(_record()))

    out = contextvars.copy_context().run(in_request)
    assert out["request_id"] == "req-42"
    assert request_id.get() == "-"  # the caller's context is untouched
    assert json.loads(JsonFormatter().format(_record()))["request_id"] == "-"


@pytest.fixture()
def modelinit_logger():
    """Restore the `modelinit` logger after a test configures it."""
    logger = logging.getLogger("modelinit")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield logger
    for h in list(logger.handlers):
        if h not in saved[0]:
            logger.removeHandler(h)
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


def test_configure_logging_json(modelinit_logger):
    stream = io.StringIO()
    configure_logging("json", "debug", stream=stream)
    configure_logging("json", "DEBUG", stream=stream)  # idempotent: still one handler
    ours = [h for h in modelinit_logger.handlers if getattr(h, "_modelinit", False)]
    assert len(ours) == 1

    def in_request():
        request_id.set("abc")
        logging.getLogger("modelinit.server").debug("Init %s", "gpt2", extra={"files": 2})

    contextvars.copy_context().run(in_request)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1  # not duplicated
    out = json.loads(lines[0])
    assert out["msg"] == "Init gpt2" and out["request_id"] == "abc" and out["files"] == 2
    assert out["logger"] == "modelinit.server" and out["level"] == "DEBUG"
    assert not logging.getLogger().handlers or all(not getattr(h, "_modelinit", False) for h in logging.getLogger().handlers)


def test_configure_logging_text(modelinit_logger):
    stream = io.StringIO()
    configure_logging("text", logging.INFO, stream=stream)
    log = logging.getLogger("modelinit.server")
    log.debug("hidden")
    contextvars.copy_context().run(lambda: (request_id.set("r1"), log.info("draining (grace %ds)", 30)))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO modelinit\.server \[r1\] draining \(grace 30s\)", lines[0])


def test_configure_logging_rejects_bad_values(modelinit_logger):
    before = list(modelinit_logger.handlers)
    with pytest.raises(ValueError, match="log_format"):
        configure_logging("yaml")
    with pytest.raises(ValueError, match="log_level"):
        configure_logging("text", "LOUD")
    assert modelinit_logger.handlers == before  # nothing installed
