"""A local Ray cluster of the tests' own, started in a process of its own.

``ray.init()`` from the pytest process starts the GCS and the raylet itself: it forks them (with
a Python ``preexec_fn``) from a process that, by then, runs the gRPC threads of every in-process
server and client the earlier tests left (gRPC logs "Other threads are currently calling into
gRPC, skipping fork() handlers"), and waits a fixed 30 s for the raylet to register. Once, on a
fresh CI-class machine, that wait ran out ("Failed to get node info: Deadline Exceeded") and all
five Ray tests failed at setup, while the same module alone passed. Here ``ray start --head
--block`` runs as a fresh process instead (a new session, a clean environment, its own short temp
dir, loopback only, no dashboard); its readiness is awaited with a generous deadline and one
retry, and the tests only *join* it (``ray.init(address=...)``, which starts no process). Stopping
it kills its whole process group, so no GCS, raylet or worker outlives the module.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import pytest

#: Set in the joining process too (:func:`driver_env`). Ray 2.60 turns token authentication on for
#: a cluster that ``ray start`` finds a token for in ``~/.ray/auth_token`` (any earlier local
#: ``ray.init()`` on the machine writes one), while a driver given an explicit address sends none
#: unless told: its join is then refused ("InvalidAuthToken"). A loopback test cluster runs without.
DRIVER_ENV = {"RAY_AUTH_MODE": "disabled"}
#: How long one start may take before it is abandoned (Ray waits 30 s for its raylet itself).
STARTUP_S = 120.0
ATTEMPTS = 2


class RayStartError(RuntimeError):
    """The cluster did not start: the message carries each attempt's log tail."""


@dataclass
class RayCluster:
    """A running ``ray start --head --block`` process group; ``address`` is its GCS."""

    process: subprocess.Popen
    address: str
    temp_dir: pathlib.Path
    log: pathlib.Path
    attempts: list[str] = field(default_factory=list)

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM to the whole group (ray start, GCS, raylet, workers), SIGKILL after ``grace``
        seconds (`ray start --block`, its GCS and an idle worker outlive a SIGTERM by more than
        20 s: a caller that keeps nothing of the cluster may cut the wait short)."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            if _group_gone(self.process, wait):
                break
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _group_gone(process: subprocess.Popen, wait: float) -> bool:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        process.poll()  # reap the leader, so its group can empty
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _ray_command() -> list[str]:
    script = pathlib.Path(sys.executable).with_name("ray")
    return [str(script)] if script.exists() else [sys.executable, "-m", "ray.scripts.scripts"]


def _start_once(num_cpus: int, env: dict[str, str]) -> RayCluster:
    # Short, under /tmp: Ray's unix socket paths (temp dir + session + sockets/plasma_store) must
    # fit in 107 bytes, which pytest's tmp_path may not.
    temp = pathlib.Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    log = temp / "start.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*_ray_command(), "start", "--head", "--block", "--port=0", "--node-ip-address=127.0.0.1",
             f"--num-cpus={num_cpus}", f"--temp-dir={temp}", "--include-dashboard=false",
             "--dashboard-agent-listen-port=0", "--disable-usage-stats"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    cluster = RayCluster(process, "", temp, log)
    address_file = temp / "ray_current_cluster"
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        # ray start prints this only once its raylet has registered with the GCS.
        if address_file.exists() and b"Ray runtime started." in log.read_bytes():
            cluster.address = address_file.read_text().strip()
            return cluster
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-3000:]
    why = f"exited with {process.returncode}" if process.returncode is not None else f"not ready in {STARTUP_S:.0f} s"
    cluster.stop()
    raise RayStartError(f"ray start {why}; its output ends:\n{tail}")


def start(num_cpus: int = 2, attempts: int = ATTEMPTS) -> RayCluster:
    """A new local cluster of ``num_cpus`` CPUs; raises :class:`RayStartError` after ``attempts``
    failed starts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_USAGE_STATS_ENABLED="0", OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1", **DRIVER_ENV)
    failures = []
    for attempt in range(1, attempts + 1):
        try:
            cluster = _start_once(num_cpus, env)
        except RayStartError as e:
            failures.append(f"attempt {attempt}: {e}")
            continue
        cluster.attempts = failures
        return cluster
    raise RayStartError("a local Ray cluster did not start:\n" + "\n".join(failures))


@contextmanager
def driver_env() -> Iterator[None]:
    """:data:`DRIVER_ENV` in this process's environment while a test joins and uses the cluster
    (pytest's MonkeyPatch puts the previous values back, unset ones unset)."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in DRIVER_ENV.items():
            patch.setenv(key, value)
        yield
