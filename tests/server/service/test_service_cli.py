"""Service startup and CLI details: a busy port refuses to start, metrics follow --host, --version,
--parallel without --server, explain's policy title, decimal progress units, reflection, default
size caps, and a client that fails fast on a wrong address or TLS setup but still rides out a
lost server. Loopback only, free ports, bounded timeouts."""
from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import socket
import subprocess
import sys
import threading
import time

import grpc
import modelinit
import pytest
from modelinit import ModelInitError
from modelinit.cli import build_parser, main, policy_title
from modelinit.client import RetryPolicy, connect_failure
from modelinit_server.service.command import server_config
from modelinit_server.service.limits import DEFAULT_MAX_DIM, DEFAULT_MAX_PARAMS, DEFAULT_MAX_TENSORS, Limits
from modelinit_server.service.server import BackgroundServer, ServerConfig, metrics_interface
from modelinit_wire.v1 import modelinit_pb2 as pb

from tests.support import REPO, TINY, recording_rpcs, recording_sleeps
from tests.support.tls_certs import make_certs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "modelinit.cli", "serve", "--device", "reference", *args]


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("tls"))


# --- 1. a busy port -----------------------------------------------------------------------------

def test_second_serve_on_a_busy_port_refuses_to_start(server_process):
    first = server_process()
    port = first.target.rsplit(":", 1)[1]
    second = subprocess.Popen(serve_cmd("--host", "127.0.0.1", "--port", port), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    # Waits for what the second server does, not for a time: it prints its ready line if it
    # started, or exits (stdout closes). The watchdog only keeps a hung one from hanging the test.
    watchdog = threading.Timer(300, second.kill)
    watchdog.start()
    try:
        ready = second.stdout.readline()
        if "serving on" in ready:
            second.kill()
            second.communicate()
            pytest.fail(f"a second server started on the busy port {port}: {ready!r}")
        out, err = second.communicate()
        out = ready + out
    finally:
        watchdog.cancel()
    assert second.returncode == 1, (out, err)
    assert "serving on" not in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"modelinit: error: port 127.0.0.1:{port} is already in use"), err
    with modelinit.Client(first.target) as c:  # the first one still serves, alone
        assert c.plan(TINY["gpt2"]).total_params > 0


def test_embedded_server_on_a_busy_port_raises_oserror(background_server):
    first = background_server()
    port = first.running.port
    with pytest.raises(OSError, match=rf"^port 127\.0\.0\.1:{port} is already in use"):
        background_server(port=port)


def test_metrics_port_in_use_is_a_one_line_error(background_server):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(OSError, match=rf"^metrics port 127\.0\.0\.1:{port} is already in use"):
            background_server(metrics_port=port)


# --- 2. the metrics interface follows --host ----------------------------------------------------

def test_metrics_listen_where_grpc_does_unless_told_otherwise(background_server):
    loopback = background_server(metrics_port=0)
    assert loopback.running.metrics.http_address == ("127.0.0.1", loopback.running.metrics_port)
    everywhere = background_server(metrics_port=0, metrics_host="0.0.0.0")
    assert everywhere.running.metrics.http_address[0] == "0.0.0.0"


@pytest.mark.parametrize(("argv", "interface"), [
    (["--host", "127.0.0.1"], "127.0.0.1"),
    (["--host", "[::]"], "::"),
    ([], "::"),  # the default --host, [::]
    (["--host", "127.0.0.1", "--metrics-host", "0.0.0.0"], "0.0.0.0"),
    (["--host", "127.0.0.1", "--metrics-host", "[::]"], "::"),
])
def test_metrics_host_defaults_to_host(argv, interface):
    cfg = server_config(build_parser().parse_args(["serve", "--metrics-port", "9090", *argv]))
    assert metrics_interface(cfg) == interface


# --- 3. --version, --parallel, explain's title, progress units ----------------------------------

def test_version_prints_the_package_and_algorithm_versions(capsys):
    from modelinit_server.engine import ALGORITHM_VERSION, ALGORITHM_VERSIONS

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"modelinit {importlib.metadata.version('modelinit')} "), out
    assert f"algorithm versions {', '.join(map(str, ALGORITHM_VERSIONS))}; default {ALGORITHM_VERSION}" in out
    r = subprocess.run([sys.executable, "-m", "modelinit.cli", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == out


def test_parallel_below_one_is_an_error(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["init", "gpt2", "--out", str(out), "--parallel", "0"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "modelinit: error: --parallel: must be at least 1, got 0"
    assert not out.exists()


def test_policy_title_says_what_was_given(tmp_path):
    rules = [pb.Rule(match=pb.Match(kinds=["norm"]), init=pb.Distribution(constant=pb.Constant(value=1.0)))]
    assert policy_title(None, pb.Policy()) == "policy hf-default"
    assert policy_title("xavier", pb.Policy(preset="xavier")) == "policy xavier"
    assert policy_title("p.yaml", pb.Policy(preset="hf-default", rules=rules)) == "policy file p.yaml (custom rules + preset hf-default)"
    assert policy_title("conf/p.json", pb.Policy(rules=rules)) == "policy file conf/p.json (custom rules)"
    assert policy_title("p.yaml", pb.Policy(preset="gpt2")) == "policy file p.yaml (preset gpt2)"
    assert policy_title(None, pb.Policy(preset="gpt2", rules=rules)) == "custom rules + preset gpt2"


def test_explain_titles_a_policy_file_by_its_name(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY["gpt2"]))
    policy = tmp_path / "mine.yaml"
    policy.write_text("preset: hf-default\nrules:\n  - match: {kinds: [norm]}\n    init: ones\n")
    assert main(["explain", str(cfg), "--policy", str(policy)]) == 0, capsys.readouterr().err
    first = capsys.readouterr().out.splitlines()[0]
    assert f"policy file {policy} (custom rules + preset hf-default):" in first, first


def test_progress_bar_counts_decimal_units_like_the_summary(monkeypatch):
    import tqdm
    from modelinit.progress_bar import progress_bar

    made = {}

    class Bar:
        def __init__(self, **kwargs):
            made.update(kwargs)

        def update(self, n):
            pass

        def close(self):
            pass

    monkeypatch.setattr(tqdm, "tqdm", Bar)
    progress_bar(True, 5 * 10**9)(None)
    assert made["unit"] == "B" and made["unit_scale"] and made["unit_divisor"] == 1000  # 5 GB shows as 5.00GB


# --- 4. reflection ------------------------------------------------------------------------------

def test_reflection_serves_what_grpcio_reflection_offers_and_docs_say_so():
    has_v1 = importlib.util.find_spec("grpc_reflection.v1") is not None
    assert not has_v1, "grpcio-reflection now ships grpc.reflection.v1: serve it beside v1alpha (server.py) and update the docs"
    ops = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    assert "grpc.reflection.v1alpha.ServerReflection" in ops and "no `grpc.reflection.v1` service" in ops


# --- 5. size caps on by default -----------------------------------------------------------------

def test_size_caps_are_on_by_default_and_the_cli_agrees():
    limits = Limits()
    assert (limits.max_params, limits.max_dim, limits.max_tensors) == (DEFAULT_MAX_PARAMS, DEFAULT_MAX_DIM, DEFAULT_MAX_TENSORS)
    assert all(v > 0 for v in (limits.max_params, limits.max_dim, limits.max_rank, limits.max_tensors))
    assert server_config(build_parser().parse_args(["serve"])).limits == limits
    assert ServerConfig().limits == limits
    off = server_config(build_parser().parse_args(["serve", "--max-params", "0", "--max-dim", "0", "--max-tensors", "0"])).limits
    assert (off.max_params, off.max_dim, off.max_tensors) == (0, 0, 0)



def _leaves(config, prefix=""):
    """Every plain field of a ServerConfig, its nested StreamPolicy and Limits included: name -> value."""
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        out.update(_leaves(value, f"{prefix}{f.name}.") if dataclasses.is_dataclass(value) else {prefix + f.name: value})
    return out


def test_serve_flags_default_to_the_server_config(monkeypatch):
    """`modelinit serve`'s flags (client/modelinit/cli.py, so --help needs no server extra) and
    ServerConfig/StreamPolicy/Limits (the server) write each default down once a side: no default
    may drift between them, the limits' only as before."""
    monkeypatch.delenv("MODELINIT_TOKEN", raising=False)  # --token's default is read from it
    assert _leaves(server_config(build_parser().parse_args(["serve"]))) == _leaves(ServerConfig())


def test_every_server_config_field_has_a_serve_flag(certs, monkeypatch):
    """Every field reaches ServerConfig from its flag: set each flag off its default and see every
    field change (a new field without a flag, or a flag that is dropped, fails here)."""
    monkeypatch.delenv("MODELINIT_TOKEN", raising=False)
    argv = ["serve", "--host", "127.0.0.1", "--port", "1", "--device", "reference", "--workers", "3", "--grace", "1",
            "--shutdown-delay", "2", "--max-streams", "3", "--idle-timeout", "5", "--max-params", "7", "--max-dim", "7",
            "--max-rank", "2", "--max-tensors", "9", "--max-request-bytes", "4096", "--tls-cert", str(certs.server_cert),
            "--tls-key", str(certs.server_key), "--tls-client-ca", str(certs.ca), "--token", "t", "--metrics-port", "9",
            "--metrics-host", "127.0.0.2", "--reflection"]
    given, defaults = _leaves(server_config(build_parser().parse_args(argv))), _leaves(ServerConfig())
    assert given.keys() == defaults.keys()
    assert [name for name in given if given[name] == defaults[name]] == []

@pytest.mark.slow
def test_the_largest_preset_fits_the_default_caps(background_server):
    server = background_server()  # default limits
    with modelinit.Client(server.target) as c:
        plan = c.plan("deepseek-v3")
    assert plan.total_params > 600e9 and plan.tensor_count > 40_000


@pytest.mark.parametrize(("config", "flag"), [
    # ~4.4e12 parameters (17.6 TB of float32): under the built-in 10^13, over the default cap.
    ({**TINY["llama"], "vocab_size": 32000, "hidden_size": 65536, "intermediate_size": 262144, "num_hidden_layers": 64,
      "num_attention_heads": 64, "num_key_value_heads": 64}, "--max-params"),
    # One vocabulary of 2^25 rows: 2.1e9 parameters, a dimension over 2^24.
    ({**TINY["gpt2"], "vocab_size": 1 << 25}, "--max-dim"),
])
def test_default_caps_refuse_oversized_models(background_server, config, flag):
    server = background_server()
    with modelinit.Client(server.target) as c, pytest.raises(ModelInitError) as e:
        c.plan(config)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and flag in e.value.details, e.value.details


# --- 6. fail fast on a wrong address or TLS setup; retry a lost server --------------------------
# "Fast" is counted, not timed: the client made one attempt and never backed off to retry.

def assert_one_try_no_retry(rpcs, caplog) -> None:
    assert rpcs.count("/Plan") == 1, f"expected one Plan attempt, got {rpcs.methods}"
    retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert not retries, retries


def test_plan_against_a_closed_port_fails_fast(caplog):
    port = free_port()
    with (recording_rpcs() as rpcs, caplog.at_level("WARNING", logger="modelinit.client"),
          modelinit.Client(f"127.0.0.1:{port}") as c, pytest.raises(ModelInitError) as e):  # default 120 s deadline
        c.plan("gpt2")
    assert_one_try_no_retry(rpcs, caplog)
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    assert e.value.details.startswith(f"cannot reach 127.0.0.1:{port}: connection refused; check --server"), e.value.details


def test_cli_plan_against_a_closed_port_is_one_line_and_fast():
    port = free_port()
    r = subprocess.run([sys.executable, "-m", "modelinit.cli", "plan", "gpt2", "--server", f"127.0.0.1:{port}"],
                       capture_output=True, text=True, timeout=300)  # a hang guard only (default --retry-deadline 120)
    # Fast = no retry: a retry would log "...; retrying in ..." on stderr (logging's last-resort
    # handler), and stderr holds exactly the one error line.
    assert "retrying in" not in r.stderr, r.stderr
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"modelinit: error: cannot reach 127.0.0.1:{port}: connection refused; check --server (host:port) and that the server is running"]


def test_tls_with_the_wrong_ca_fails_fast_with_a_trust_message(background_server, certs, caplog):
    server = background_server(tls_cert=certs.server_cert, tls_key=certs.server_key)
    with (recording_rpcs() as rpcs, caplog.at_level("WARNING", logger="modelinit.client"),
          modelinit.Client(server.target, ca=certs.other_ca) as c, pytest.raises(ModelInitError) as e):
        c.plan("gpt2")
    assert_one_try_no_retry(rpcs, caplog)
    assert e.value.details.startswith(f"cannot reach {server.target}: TLS handshake failed: the server's certificate is not trusted")
    assert "--tls-ca" in e.value.details
    with modelinit.Client(server.target, ca=certs.ca) as c:  # the right CA: served
        assert c.plan(TINY["gpt2"]).total_params > 0


def test_tls_client_against_a_plaintext_server_fails_fast(background_server, certs, caplog):
    server = background_server()
    with (recording_rpcs() as rpcs, caplog.at_level("WARNING", logger="modelinit.client"),
          modelinit.Client(server.target, ca=certs.ca) as c, pytest.raises(ModelInitError) as e):
        c.plan("gpt2")
    assert_one_try_no_retry(rpcs, caplog)
    assert "does not speak TLS" in e.value.details


def test_plaintext_client_against_a_tls_server_fails_fast(background_server, certs, caplog):
    server = background_server(tls_cert=certs.server_cert, tls_key=certs.server_key)
    with (recording_rpcs() as rpcs, caplog.at_level("WARNING", logger="modelinit.client"),
          modelinit.Client(server.target) as c, pytest.raises(ModelInitError) as e):
        c.plan("gpt2")
    assert_one_try_no_retry(rpcs, caplog)
    assert e.value.details.startswith(f"cannot reach {server.target}: the server closed the connection during setup")


def test_a_server_lost_after_it_answered_is_retried_until_the_deadline(caplog):
    """Counted, not timed: the lost server is tried again and again (backoff pauses between the
    tries), the pauses together stay within the policy's 1 s deadline (not the default 120 s),
    and then the client gives up with UNAVAILABLE. The one clock reading left is a lower bound
    (it did not give up before its deadline): a slow machine only makes it larger."""
    server = BackgroundServer(ServerConfig(host="127.0.0.1", port=0))
    policy = RetryPolicy(deadline=1.0, initial_backoff=0.1, max_backoff=0.2)
    with recording_rpcs() as rpcs:
        c = modelinit.Client(server.target, retry=policy)
    with c:
        assert c.plan(TINY["gpt2"]).total_params > 0
        server.stop()
        before = rpcs.count("/Plan")
        t = time.monotonic()
        with caplog.at_level("WARNING", logger="modelinit.client"), pytest.raises(ModelInitError) as e, \
                recording_sleeps() as pauses:
            c.plan(TINY["gpt2"])
        waited = time.monotonic() - t
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert retries, "a server that answered before was not retried"
    assert rpcs.count("/Plan") - before == len(retries) + 1, (rpcs.methods, retries)  # one try, then one per retry
    assert sum(pauses) <= policy.deadline + 1e-6, pauses  # backed off within its deadline, then gave up
    assert waited >= 0.9 * policy.deadline, waited  # ... and not before it


def test_a_dead_first_replica_is_skipped(background_server, tmp_path):
    server = background_server()
    dead = f"127.0.0.1:{free_port()}"
    with modelinit.Client(f"{dead},{server.target}", retry=RetryPolicy(deadline=10, initial_backoff=0.05, max_backoff=0.1)) as c:
        assert c.plan(TINY["gpt2"]).total_params > 0
        result = c.init_model(TINY["gpt2"], seed=1, out_dir=tmp_path)
        assert c.last_served[server.target] == len(result.files)


@pytest.mark.parametrize(("details", "kind"), [
    (("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to remote host: "
      "Connection refused"), "connect"),
    ("errors resolving nowhere.invalid:5: [field:hostname lookup error:address lookup failed: Domain name not found]", "connect"),
    (("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:4: Tls handshake failed (TSI_PROTOCOL_FAILURE): "
      "SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: unable to get local issuer "
      "certificate: OK"), "trust"),
    (("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:4: Custom verification check failed with "
      "error: UNAUTHENTICATED: Hostname Verification Check failed."), "trust"),
    # A server that went away mid-call, or while the handshake was under way: retried.
    ("Socket closed", None),
    ("Connection reset by peer", None),
    ("failed to connect to all addresses; last error: UNKNOWN: Ssl handshake failed: SSL_ERROR_SYSCALL", "connect"),
])
def test_connect_failures_are_told_apart(details, kind):
    got = connect_failure(details)
    assert (got[0] if got else None) == kind
