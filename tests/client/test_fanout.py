"""Fan-out: one model's shards fetched in parallel from two replicas, byte-identical to one
server's run, surviving the loss of a replica mid-run."""
from __future__ import annotations

import re
import signal
import threading
import urllib.request

import grpc
import modelinit
import pytest
from modelinit import ModelInitError
from modelinit.client import RetryPolicy, split_targets

from tests.support import ServerProcess, read_folder
from tests.support.hostile_server import Hostile
from tests.support.medium_model import FAST_RETRY, MEDIUM


def _files_served(server: ServerProcess) -> float:
    port = int(re.search(r"metrics on :(\d+)", server.ready_line).group(1))
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60).read().decode()
    return float(re.search(r"^modelinit_stream_files_total ([0-9.]+)$", text, re.M).group(1))


@pytest.fixture()
def two_servers():
    servers = [ServerProcess("--metrics-port", "0", "--metrics-host", "127.0.0.1") for _ in range(2)]
    yield servers
    for s in servers:
        s.stop()


@pytest.mark.slow
def test_two_replicas_in_parallel_equal_one_server(two_servers, tmp_path, reference):
    target = ",".join(s.target for s in two_servers)
    with modelinit.Client(target) as c:
        result = c.init_model(MEDIUM, seed=7, out_dir=tmp_path, max_shard_size="16MB", parallel=2)
        served = c.last_served
    assert read_folder(tmp_path) == reference
    assert len(result.files) == len(reference) - 1  # every file but modelinit.json
    assert all(n >= 1 for n in served.values()), served
    assert all(_files_served(s) >= 1 for s in two_servers)  # the servers' own count agrees


@pytest.mark.slow
def test_a_replica_killed_mid_run_the_other_finishes(two_servers, tmp_path, reference):
    a, b = two_servers
    target = f"{a.target},{b.target}"
    killed = threading.Event()
    seen = [0]
    lock = threading.Lock()

    def progress(n: int) -> None:
        with lock:
            seen[0] += n
            if seen[0] > 8_000_000 and not killed.is_set():
                killed.set()
                a.proc.send_signal(signal.SIGKILL)

    with modelinit.Client(target, retry=FAST_RETRY) as c:
        c.init_model(MEDIUM, seed=7, out_dir=tmp_path, max_shard_size="16MB", parallel=2, progress=progress)
        served = c.last_served
    assert killed.is_set()
    assert read_folder(tmp_path) == reference
    assert served[b.target] >= 3  # b finished what a had been serving


@pytest.mark.slow
def test_a_replica_of_another_version_is_refused(two_servers, hostile, tmp_path):
    other = hostile(Hostile())  # plans different weights (another fingerprint)
    with modelinit.Client(f"{two_servers[0].target},{other}", retry=RetryPolicy(deadline=0)) as c:
        with pytest.raises(ModelInitError) as e:
            c.init_model(MEDIUM, seed=7, out_dir=tmp_path, max_shard_size="16MB", parallel=2)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and "fingerprint" in e.value.details
    assert not any(p.name.endswith(".partial") or p.name == "modelinit.json" for p in tmp_path.iterdir())


@pytest.mark.slow
def test_cli_comma_separated_servers_and_parallel(two_servers, tmp_path, reference, capsys):
    import json

    from modelinit.cli import main

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(MEDIUM))
    target = ",".join(s.target for s in two_servers)
    assert main(["init", str(cfg), "--seed", "7", "--max-shard-size", "16MB", "--server", target, "--parallel", "3",
                 "--out", str(tmp_path / "o"), "--quiet"]) == 0
    assert read_folder(tmp_path / "o") == reference
    assert main(["init", str(cfg), "--server", target, "--parallel", "0", "--out", str(tmp_path / "p")]) == 2
    assert "parallel" in capsys.readouterr().err


def test_split_targets():
    assert split_targets("a:1,b:2") == ("a:1", "b:2")
    assert split_targets(" a:1 , b:2 ") == ("a:1", "b:2")
    assert split_targets("dns:///svc.ns.svc.cluster.local:50051") == ("dns:///svc.ns.svc.cluster.local:50051",)
    assert split_targets("ipv4:10.0.0.1:1,10.0.0.2:1") == ("ipv4:10.0.0.1:1,10.0.0.2:1",)
    with pytest.raises(ModelInitError, match="empty target"):
        split_targets("a:1,,b:2")


@pytest.mark.slow
def test_one_name_for_several_replicas_is_balanced_call_by_call(two_servers, tmp_path, reference):
    """A name resolving to both replicas (what dns:/// gives in Kubernetes; ipv4: lists the same
    addresses on loopback): one channel, round-robin, the files spread over both."""
    ports = [s.target.rsplit(":", 1)[1] for s in two_servers]
    target = f"ipv4:127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}"
    with modelinit.Client(target) as c:
        assert c.targets == (target,)
        c.init_model(MEDIUM, seed=7, out_dir=tmp_path, max_shard_size="16MB", parallel=2)
    assert read_folder(tmp_path) == reference
    assert all(_files_served(s) >= 1 for s in two_servers)


def test_embedded_parallel_files_equal_one_stream(tmp_path):
    """Embedded, ``parallel`` files at once (each its own producer and SHA-256): the same folder as one
    stream, byte for byte, through the CLI too; a file that fails stops the others and leaves no
    partial file behind."""
    import json

    from modelinit.cli import main

    import modelinit

    with modelinit.Client(device="cpu") as c:
        one = c.init_model(MEDIUM, seed=7, out_dir=tmp_path / "one", max_shard_size="16MB")
        three = c.init_model(MEDIUM, seed=7, out_dir=tmp_path / "three", max_shard_size="16MB", parallel=3)
    assert len([f for f in one.files if f.name.endswith(".safetensors")]) >= 3
    assert [(f.name, f.size, f.sha256) for f in three.files] == [(f.name, f.size, f.sha256) for f in one.files]
    for f in one.files:
        assert (tmp_path / "three" / f.name).read_bytes() == (tmp_path / "one" / f.name).read_bytes()
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(MEDIUM))
    assert main(["init", str(spec), "--seed", "7", "--max-shard-size", "16MB", "--device", "cpu", "--quiet",
                 "--parallel", "2", "--out", str(tmp_path / "cli")]) == 0
    assert json.loads((tmp_path / "cli" / "modelinit.json").read_text())["files"] == \
        json.loads((tmp_path / "one" / "modelinit.json").read_text())["files"]


def test_embedded_parallel_failure_stops_the_others(tmp_path, monkeypatch):
    import modelinit
    from modelinit.destinations import folder as folder_writer
    from modelinit.errors import ModelInitError

    real = folder_writer.DirectFile.write
    calls = {"n": 0}

    def failing(self, data):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")
        real(self, data)

    monkeypatch.setattr(folder_writer.DirectFile, "write", failing)
    with modelinit.Client(device="cpu") as c, pytest.raises(ModelInitError, match="No space left"):
        c.init_model(MEDIUM, seed=7, out_dir=tmp_path / "out", max_shard_size="16MB", parallel=3)
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".partial") or p.name == "modelinit.json"]


def test_an_interrupt_stops_the_files_in_flight(tmp_path, monkeypatch):
    """Ctrl-C reaches the main thread while it waits for the files in flight: they are cut (no partial
    file left), the queued ones never start, and the interrupt goes on up — it used to wait for every
    file to be written first (the pool's exit waits for its work)."""
    import time

    from modelinit.destinations import folder as folder_writer
    from modelinit.sources import fanout

    real_wait, real_write = fanout.wait, folder_writer.DirectFile.write
    monkeypatch.setattr(folder_writer.DirectFile, "write", lambda self, data: (time.sleep(0.1), real_write(self, data))[1])

    def interrupted(fs, timeout=None, return_when="ALL_COMPLETED"):
        if return_when == fanout.FIRST_EXCEPTION:
            time.sleep(0.3)
            raise KeyboardInterrupt
        return real_wait(fs, timeout, return_when)

    monkeypatch.setattr(fanout, "wait", interrupted)
    out = tmp_path / "out"
    with modelinit.Client(device="cpu") as c, pytest.raises(KeyboardInterrupt):
        c.init_model(MEDIUM, seed=7, out_dir=out, max_shard_size="8MB", parallel=2)
    shards = sorted(p.name for p in out.iterdir() if p.name.endswith(".safetensors"))
    assert len(shards) < 5  # of 8: the run stopped
    assert not [p for p in out.iterdir() if p.name.endswith(".partial") or p.name == "modelinit.json"]
