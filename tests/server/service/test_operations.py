"""The service under faults and load, on loopback, bounded in time: a killed and restarted server,
cancelled and stalled clients, a full house of streams, SIGTERM, limits, auth, TLS, metrics."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import urllib.request

import grpc
import modelinit
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from modelinit import ModelInitError
from modelinit.client import RetryPolicy
from modelinit_server.service.limits import Limits
from modelinit_server.service.server import BackgroundServer, ServerConfig
from modelinit_server.service.servicer import StreamPolicy
from modelinit_wire.v1 import modelinit_pb2 as pb
from modelinit_wire.v1 import modelinit_pb2_grpc as pb_grpc

from tests.support import TINY, WAIT, ServerProcess, read_folder, recording_rpcs, recording_sleeps, wait_until
from tests.support.medium_model import FAST_RETRY, MEDIUM


def health_status(target: str, timeout: float = WAIT) -> int:
    with grpc.insecure_channel(target) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout).status


@pytest.mark.slow
def test_killed_server_restarted_client_resumes_byte_identical(tmp_path, reference, caplog):
    first = ServerProcess()
    port = first.target.rsplit(":", 1)[1]
    servers = [first]
    killed = threading.Event()
    seen = [0]

    def progress(n: int) -> None:
        seen[0] += n
        if seen[0] > 20_000_000 and not killed.is_set():  # in the middle of the second shard
            killed.set()
            first.proc.send_signal(signal.SIGKILL)
            first.proc.wait()
            servers.append(ServerProcess("--port", port))  # same address, a fresh process

    try:
        with modelinit.Client(first.target, retry=FAST_RETRY) as c, caplog.at_level("WARNING", logger="modelinit.client"):
            result = c.init_model(MEDIUM, seed=7, out_dir=tmp_path, max_shard_size="16MB", progress=progress)
    finally:
        for s in servers:
            s.stop()
    assert killed.is_set() and len(servers) == 2
    assert any("resuming model-" in r.getMessage() for r in caplog.records)
    assert not result.reused
    assert read_folder(tmp_path) == reference


def test_retry_gives_up_after_its_deadline(tmp_path):
    gone = ServerProcess()
    target = gone.target
    gone.stop()
    policy = RetryPolicy(deadline=1.0, initial_backoff=0.1, max_backoff=0.2)
    with modelinit.Client(target, retry=policy) as c, recording_sleeps() as pauses:
        with pytest.raises(ModelInitError) as e:
            c.init_model("gpt2", seed=0, out_dir=tmp_path)
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    # Bounded by its own policy, not the default 120 s: backoff pauses add up to 1 s at most
    # (counted, not timed; an address that never answered is not retried at all).
    assert sum(pauses) <= policy.deadline + 1e-6, pauses
    assert list(tmp_path.iterdir()) == []


def _metrics(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT).read().decode()


def _sample(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.M)
    assert m, f"{name} not in metrics"
    return float(m.group(1))


def _rss(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_cancelled_client_frees_the_stream_and_its_memory(tmp_path):
    server = ServerProcess("--metrics-port", "0", "--metrics-host", "127.0.0.1")
    try:
        line_port = int(re.search(r"metrics on :(\d+)", server.ready_line).group(1))
        with modelinit.Client(server.target) as c:
            c.init_model(MEDIUM, seed=1, out_dir=tmp_path / "warm", max_shard_size="16MB")  # warm: buffers, caches
        baseline = _rss(server.proc.pid)

        class Stop(Exception):
            pass

        def progress(n: int) -> None:
            raise Stop  # the application gives up after the first bytes

        with modelinit.Client(server.target) as c, pytest.raises(Stop):
            c.init_model(MEDIUM, seed=2, out_dir=tmp_path / "cancelled", max_shard_size="16MB", progress=progress)
        # Freed, however long that takes here: the state is checked, not the time it took.
        wait_until(lambda: _sample(_metrics(line_port), "modelinit_inflight_streams") == 0, what="in-flight streams back to 0")
        wait_until(lambda: _rss(server.proc.pid) < baseline + 48 * 2**20, what="server memory back to its baseline")
        cancelled = 'modelinit_requests_total{code="CANCELLED",method="Init"} 1.0'
        wait_until(lambda: cancelled in _metrics(line_port), what="the cancelled stream in the metrics")
        assert not any(p.name.endswith(".partial") for p in (tmp_path / "cancelled").iterdir())
    finally:
        assert server.stop() == 0


def test_stalled_reader_times_out_and_frees_the_stream(background_server):
    server = background_server(streams=StreamPolicy(idle_timeout=0.5))
    request = modelinit.client.model_request(MEDIUM, seed=3)
    with grpc.insecure_channel(server.target) as ch:
        call = pb_grpc.ModelInitStub(ch).Init(pb.InitRequest(request=request), timeout=10 * WAIT)  # a hang guard
        next(call)  # the stream is open (counted in flight before its first message); then this reader takes nothing more
        # No sleep: the reader stalls for as long as the server needs to notice (its idle timeout,
        # 0.5 s, is the only clock in this test) and end the stream.
        wait_until(lambda: server.running.servicer.inflight == 0, what="the stalled stream to be ended")
        with pytest.raises(grpc.RpcError) as e:
            for _ in call:
                pass
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "idle-timeout" in e.value.details()


@pytest.mark.slow
def test_sixteen_concurrent_clients_and_a_seventeenth_refused(tmp_path):
    # --idle-timeout: a held stream must outlast however long 16 take to start on a slow machine.
    server = ServerProcess("--max-streams", "16", "--idle-timeout", "600")
    gate = threading.Event()
    held_too_long = threading.Event()
    started = threading.Semaphore(0)
    results: dict[int, object] = {}
    # ~70 MB each: more than a stalled stream's buffers (segments + gRPC window), so a held
    # client really holds its stream open on the server.
    specs = [{**TINY["llama"], "hidden_size": 256 + 64 * (i % 2), "intermediate_size": 8192, "vocab_size": 8192 + i}
             for i in range(16)]

    def run(i: int) -> None:
        first = [True]

        def progress(n: int) -> None:
            if first[0]:
                first[0] = False
                started.release()
                if not gate.wait(300):  # hold the stream open until all 16 are in and the 17th is answered
                    held_too_long.set()

        try:
            with modelinit.Client(server.target) as c:
                results[i] = c.init_model(specs[i], seed=100 + i, out_dir=tmp_path / str(i), progress=progress)
        except Exception as e:  # noqa: BLE001 - reported below
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    try:
        for t in threads:
            t.start()
        for _ in range(16):
            assert started.acquire(timeout=WAIT), "a stream did not start"
        with recording_rpcs() as rpcs:
            seventeenth = modelinit.Client(server.target)
        with seventeenth as c, pytest.raises(ModelInitError) as e:
            c.init_model("gpt2", seed=0, out_dir=tmp_path / "17")
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-streams" in e.value.details
        # Refused, not queued: answered while all 16 streams were still held open, on its one try.
        assert not results and not held_too_long.is_set(), f"a held stream ended before the 17th was answered: {results}"
        assert rpcs.count("/Init") == 1, rpcs.methods
        gate.set()
        for t in threads:
            t.join(120)
        for i in range(16):
            assert isinstance(results[i], modelinit.InitResult), results[i]
        from modelinit.verify import verify_folder

        for i in range(16):
            assert verify_folder(tmp_path / str(i), regenerate=False).ok
        assert server.peak_rss_bytes() < 1536 * 2**20
    finally:
        gate.set()
        assert server.stop() == 0


def refuses_new_calls(target: str) -> bool:
    """Whether a new call to ``target`` is refused (UNAVAILABLE): the server stopped taking calls."""
    try:
        health_status(target)
    except grpc.RpcError as e:
        return e.code() == grpc.StatusCode.UNAVAILABLE
    return False


@pytest.mark.slow
def test_sigterm_reports_not_serving_drains_and_exits_zero(tmp_path, reference):
    # No sleeps: each step waits for the server's own signal. --grace only bounds the drain (the
    # server exits as soon as the stream ends), generous so that a slow machine never has the
    # stream cut; --idle-timeout, so the stream held below is not ended as idle.
    server = ServerProcess("--grace", "300", "--shutdown-delay", "1.5", "--idle-timeout", "600")
    state: dict[str, object] = {}
    signalled = threading.Event()
    with grpc.insecure_channel(server.target) as ch:
        watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=""), timeout=10 * WAIT)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING

        def progress(n: int) -> None:
            if not signalled.is_set():
                signalled.set()
                server.proc.send_signal(signal.SIGTERM)
                state["health"] = next(watch).status  # told at SIGTERM, before the delay: NOT_SERVING
                watch.cancel()
                # Hold this stream until the delay is over and the server takes no new calls: the
                # stream, in flight, must go on through the drain.
                wait_until(lambda: refuses_new_calls(server.target), what="the server to stop taking new calls")

        with modelinit.Client(server.target, retry=RetryPolicy(deadline=0)) as c:
            c.init_model(MEDIUM, seed=7, out_dir=tmp_path, max_shard_size="16MB", progress=progress)
    assert state["health"] == health_pb2.HealthCheckResponse.NOT_SERVING
    assert read_folder(tmp_path) == reference  # the in-flight stream finished within the grace period
    assert server.proc.wait(WAIT) == 0


def test_limits_name_the_flag(background_server):
    server = background_server(limits=Limits(max_params=1_000_000, max_request_bytes=4096))
    with modelinit.Client(server.target) as c:
        with pytest.raises(ModelInitError) as e:
            c.plan("gpt2")
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "--max-params" in e.value.details
        big = {**TINY["llama"], "padding": "x" * 8000}
        with pytest.raises(ModelInitError) as e:
            c.plan(big)
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert c.plan(TINY["llama"]).total_params < 1_000_000


def test_limits_validate():
    with pytest.raises(ValueError, match="max_params"):
        Limits(max_params=-1)
    with pytest.raises(ValueError, match="max_request_bytes"):
        Limits(max_request_bytes=10)
    with pytest.raises(ValueError, match="max_streams"):
        StreamPolicy(max_streams=0)


def test_token_auth_with_tls_round_trip(background_server, tmp_path):
    from tests.support.tls_certs import make_certs

    certs = make_certs(tmp_path / "certs")
    server = background_server(tls_cert=str(certs.server_cert), tls_key=str(certs.server_key), tls_client_ca=str(certs.ca),
                      token="s3cret-token")
    target = f"localhost:{server.running.port}"
    mtls = dict(ca=str(certs.ca), cert=str(certs.client_cert), key=str(certs.client_key))
    with modelinit.Client(target, token="wrong", **mtls) as c, pytest.raises(ModelInitError) as e:
        c.plan(TINY["gpt2"])
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    with modelinit.Client(target, **mtls) as c, pytest.raises(ModelInitError) as e:
        c.plan(TINY["gpt2"])
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    with modelinit.Client(target, token="s3cret-token", **mtls) as c:
        result = c.init_model(TINY["gpt2"], seed=1, out_dir=tmp_path / "out")
    assert result.files and (tmp_path / "out" / "modelinit.json").exists()
    wait_until(lambda: server.running.metrics.value("modelinit_rejected_total", reason="unauthenticated") == 2, what="the count")


def test_health_needs_no_token(background_server):
    server = background_server(token="abc")
    assert health_status(server.target) == health_pb2.HealthCheckResponse.SERVING
    with modelinit.Client(server.target) as c, pytest.raises(ModelInitError) as e:
        c.plan("gpt2")
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_metrics_count_requests_bytes_and_tensors(background_server, tmp_path):
    server = background_server(metrics_port=0, metrics_host="127.0.0.1")
    with modelinit.Client(server.target) as c:
        result = c.init_model(TINY["bert"], seed=1, out_dir=tmp_path)
        with pytest.raises(ModelInitError):
            c.plan("gpt2", dtype="float64")
    m = server.running.metrics
    # a call is counted when its handler returns, just after the client has its status
    wait_until(lambda: m.value("modelinit_requests_total", method="Plan", code="INVALID_ARGUMENT") == 1, what="the count")
    assert m.value("modelinit_requests_total", method="Init", code="OK") == 1
    assert m.value("modelinit_requests_total", method="Plan", code="OK") == 1  # init_model plans first
    assert m.value("modelinit_requests_total", method="Plan", code="INVALID_ARGUMENT") == 1
    assert m.value("modelinit_stream_bytes_total") == sum(f.size for f in result.files)
    plan = modelinit.Client().plan(TINY["bert"], seed=1)
    assert m.value("modelinit_stream_tensors_total") == plan.tensor_count
    assert m.value("modelinit_generated_bytes_total") > 0
    text = _metrics(server.running.metrics_port)
    assert "modelinit_inflight_streams 0.0" in text


def test_request_id_is_returned_and_logged(background_server, caplog):
    from modelinit_server.service.observability import RequestIdFilter

    caplog.handler.addFilter(RequestIdFilter())
    server = background_server()
    with grpc.insecure_channel(server.target) as ch:
        stub = pb_grpc.ModelInitStub(ch)
        request = pb.PlanRequest(request=modelinit.client.model_request("gpt2", seed=0))
        with caplog.at_level("INFO", logger="modelinit"):
            _, call = stub.Plan.with_call(request, metadata=(("x-request-id", "job-42.node-3"),), timeout=WAIT)
            assert ("x-request-id", "job-42.node-3") in tuple(call.initial_metadata())
            init = stub.Init(pb.InitRequest(request=modelinit.client.model_request(TINY["gpt2"], seed=0)),
                             metadata=(("x-request-id", "job-43"),), timeout=WAIT)
            list(init)
    assert any(getattr(r, "request_id", None) == "job-43" for r in caplog.records if r.name == "modelinit.server")


def test_rerun_into_a_complete_folder_does_nothing(tmp_path):
    c = modelinit.Client()
    first = c.init_model(TINY["llama"], seed=5, out_dir=tmp_path)
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    again = c.init_model(TINY["llama"], seed=5, out_dir=tmp_path)
    assert again.reused and again.files == first.files
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before
    other = c.init_model(TINY["llama"], seed=6, out_dir=tmp_path)  # another seed: rewritten
    assert not other.reused and other.fingerprint != first.fingerprint


def test_server_cli_flags_reach_the_config(tmp_path):
    out = subprocess.run([sys.executable, "-m", "modelinit.cli", "serve", "--port", "0", "--max-streams", "0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "max_streams" in out.stderr
    out = subprocess.run([sys.executable, "-m", "modelinit.cli", "serve", "--port", "0", "--tls-cert", "x.pem"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "tls_key" in out.stderr


def test_json_logs_from_the_server_process(tmp_path):
    server = ServerProcess("--log-format", "json")
    try:
        with modelinit.Client(server.target) as c:
            c.init_model(TINY["gpt2"], seed=1, out_dir=tmp_path)
    finally:
        assert server.stop() == 0
    lines = [json.loads(line) for line in server.proc.stderr.read().splitlines() if line.startswith("{")]
    init = [entry for entry in lines if entry["msg"].startswith("Init done")]
    assert init and re.fullmatch(r"[0-9a-f]{32}", init[0]["request_id"])


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@pytest.fixture(scope="module")
def fuzz_server():
    server = BackgroundServer(ServerConfig(host="127.0.0.1", port=0, limits=Limits(max_params=10**9)))
    yield server
    server.stop()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=512), method=st.sampled_from(["Plan", "Init"]))
def test_malformed_request_bytes_get_a_status_not_a_crash(fuzz_server, raw, method):
    """Arbitrary bytes as the request message: a clear status (or a valid answer), never a hang."""
    with grpc.insecure_channel(fuzz_server.target) as ch:
        path = f"/modelinit.v1.ModelInit/{method}"
        try:
            if method == "Plan":
                ch.unary_unary(path, request_serializer=None, response_deserializer=None)(raw, timeout=WAIT)
            else:
                for _ in ch.unary_stream(path, request_serializer=None, response_deserializer=None)(raw, timeout=WAIT):
                    pass
        except grpc.RpcError as e:
            assert e.code() in {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE}, e
            assert e.details()
    assert health_status(fuzz_server.target) == health_pb2.HealthCheckResponse.SERVING
    assert fuzz_server.running.servicer.inflight == 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_sigterm_past_the_grace_period_client_resumes_on_another_replica(tmp_path, reference, caplog):
    a = ServerProcess("--grace", "0.3")
    port_b = _free_port()
    # Two replicas behind one name; the second comes up only once the first has drained (its
    # grace period over, the stream cut) and exited, so the stream surely starts on the first
    # and surely is cut, however fast or slow this machine.
    target = f"ipv4:127.0.0.1:{a.target.rsplit(':', 1)[1]},127.0.0.1:{port_b}"
    servers = [a]
    signalled = threading.Event()
    seen = [0]

    def progress(n: int) -> None:
        seen[0] += n
        if seen[0] > 20_000_000 and not signalled.is_set():
            signalled.set()
            a.proc.send_signal(signal.SIGTERM)
            a.proc.wait(WAIT)  # past its grace period: the stream is cut and the replica gone
            servers.append(ServerProcess("--port", str(port_b)))

    try:
        with modelinit.Client(target, retry=FAST_RETRY) as c, caplog.at_level("WARNING", logger="modelinit.client"):
            c.init_model(MEDIUM, seed=7, out_dir=tmp_path, max_shard_size="16MB", progress=progress)
        assert a.proc.wait(WAIT) == 0
        assert any("resuming model-" in r.getMessage() for r in caplog.records)  # the stream was cut and resumed
    finally:
        for s in servers:
            s.stop()
    assert signalled.is_set() and len(servers) == 2
    assert read_folder(tmp_path) == reference


def test_reflection_lists_the_services(background_server):
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    server = background_server(reflection=True)
    with grpc.insecure_channel(server.target) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        (answer,) = list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=WAIT))
    names = {s.name for s in answer.list_services_response.service}
    assert {"modelinit.v1.ModelInit", "grpc.health.v1.Health"} <= names


def test_cli_token_from_env_and_file(background_server, tmp_path, monkeypatch, capsys):
    from modelinit.cli import main

    server = background_server(token="t0ken")
    monkeypatch.delenv("MODELINIT_TOKEN", raising=False)
    assert main(["plan", "gpt2", "--server", server.target, "--retry-deadline", "0"]) == 1
    assert "bearer token" in capsys.readouterr().err
    (tmp_path / "tok").write_text("t0ken\n")
    assert main(["plan", "gpt2", "--server", server.target, "--token", f"@{tmp_path / 'tok'}"]) == 0
    capsys.readouterr()
    monkeypatch.setenv("MODELINIT_TOKEN", "t0ken")
    assert main(["init", TINY_PATH(tmp_path), "--server", server.target, "--out", str(tmp_path / "o"), "--quiet"]) == 0
    assert main(["verify", str(tmp_path / "o"), "--server", server.target]) == 0


def TINY_PATH(tmp_path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY["gpt2"]))
    return str(path)
