"""The cores modelinit uses: the usable cores (affinity, cgroup quota), numba's default pool, and how
many files the embedded job produces at once when the caller does not say (one file's SHA-256 is one
serial stream, so several files go together only where the machine's cores outrun one hash)."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import modelinit
import pytest
from modelinit import cli
from modelinit.sources import embedded as embedded_source
from modelinit.sources.embedded import EmbeddedSource
from modelinit_server.engine import backends
from modelinit_host import usable_cores as quota
from modelinit_host.usable_cores import usable_cores
from modelinit_server.service import embedded
from modelinit_server.service.embedded import EmbeddedService

from tests.support import REPO, TINY, read_folder

SPEC = TINY["gpt2"]
SHARDED = {"seed": 3, "max_shard_size": "200KB"}  # 5 shards


@pytest.fixture()
def cgroup(tmp_path, monkeypatch):
    monkeypatch.setattr(quota, "CGROUP", tmp_path)
    monkeypatch.setattr(quota.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    return tmp_path


def test_usable_cores_are_the_affinity_without_a_quota(cgroup):
    assert usable_cores() == 16
    (cgroup / "cpu.max").write_text("max 100000\n")
    assert usable_cores() == 16


def test_a_cgroup_v2_quota_caps_the_cores(cgroup):
    (cgroup / "cpu.max").write_text("250000 100000\n")  # a Kubernetes limit of 2.5 CPUs
    assert usable_cores() == 3
    (cgroup / "cpu.max").write_text("5000 100000\n")
    assert usable_cores() == 1


def test_a_cgroup_v1_quota_caps_the_cores(cgroup):
    (cgroup / "cpu").mkdir()
    (cgroup / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    (cgroup / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert usable_cores() == 4
    (cgroup / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")  # no limit
    assert usable_cores() == 16


def test_numbas_pool_is_the_usable_cores_unless_the_user_sets_it(tmp_path):
    """numba's own default is the CPU affinity's cores, whatever a container's CPU limit (a 64-core
    node under a 4-CPU limit ran 64 throttled threads); the kernel's module sets NUMBA_NUM_THREADS,
    when unset, to the usable cores. Here a cgroup quota of one CPU, in a fresh process."""
    pytest.importorskip("numba")
    if usable_cores() < 2:
        pytest.skip("needs two usable cores to tell a quota of one from the affinity")
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    code = ("import pathlib, sys; from modelinit_host import usable_cores as quota; quota.CGROUP = pathlib.Path(sys.argv[1]); "
            "from modelinit_server.engine import cpu; print(cpu.threads() if cpu.available() else 'none')")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_NUM_THREADS"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "server"), str(REPO / "client"), str(REPO / "proto"), *sys.path])

    def threads(**extra) -> str:
        proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env={**env, **extra}, capture_output=True,
                              text=True, timeout=120, check=True)
        return proc.stdout.strip()

    if threads() == "none":
        pytest.skip("the numba kernel is not available here")
    assert threads() == "1"  # a one-CPU quota: one thread, whatever the affinity
    assert threads(NUMBA_NUM_THREADS="2") == "2"  # the user's setting wins


@pytest.mark.parametrize("name, ncores, threads, expected", [
    ("cuda", 16, 16, 8),  # a GPU node: a hash and a writer per file
    ("cuda", 1, 1, 1),
    ("cpu", 16, 16, 4),  # one hash keeps pace with about three generating cores
    ("cpu", 64, 16, 4),  # numba's threads, not the machine's cores, generate
    ("cpu", 2, 2, 1),  # this VM and CI: the hash beside the generation, one file
    ("reference", 64, 64, 1),
])
def test_files_at_once_by_engine_and_cores(monkeypatch, name, ncores, threads, expected):
    engine = EmbeddedService("reference")
    engine._backend = dataclasses.replace(backends.REFERENCE, name=name)
    monkeypatch.setattr(embedded, "usable_cores", lambda: ncores)
    if name == "cpu":
        from modelinit_server.engine import cpu

        monkeypatch.setattr(cpu, "threads", lambda: threads)
    assert engine.files_at_once() == expected


def test_the_embedded_client_asks_the_engine_when_parallel_is_not_given(tmp_path, monkeypatch):
    """parallel=None (the API's and the CLI's default): the engine's choice for a sharded model, at
    most one per shard; a one-shard model does not ask; the bytes are those of one file at a time."""
    asked, used = [], []
    monkeypatch.setattr(EmbeddedSource, "files_at_once", lambda self, *job: asked.append(1) or 3)  # of 5 shards
    each_file = embedded_source.each_file

    def recording(open_stream, indices, write, parallel, progress):
        used.append(parallel)
        return each_file(open_stream, indices, write, parallel, progress)

    monkeypatch.setattr(embedded_source, "each_file", recording)
    with modelinit.Client(device="reference") as c:
        c.init_model(SPEC, out_dir=tmp_path / "auto", **SHARDED)
        assert asked == [1] and used == [3]
        c.init_model(SPEC, out_dir=tmp_path / "one", parallel=1, **SHARDED)
        c.init_model(SPEC, out_dir=tmp_path / "whole", seed=3)  # one shard (and config.json): nothing to spread
        monkeypatch.setattr(EmbeddedSource, "files_at_once", lambda self, *job: 99)
        c.init_model(SPEC, out_dir=tmp_path / "capped", **SHARDED)
    assert asked == [1] and used == [3, 5]
    assert read_folder(tmp_path / "auto") == read_folder(tmp_path / "one")


def test_the_cli_leaves_parallel_to_the_engine_unless_given():
    assert cli.build_parser().parse_args(["init", "gpt2", "--out", "x"]).parallel is None
    assert cli.build_parser().parse_args(["init", "gpt2", "--out", "x", "--parallel", "2"]).parallel == 2


def test_parallel_must_be_none_or_a_positive_integer(tmp_path):
    with modelinit.Client(device="reference") as c:
        for bad in (0, True, 1.5):
            with pytest.raises(modelinit.ModelInitError, match="parallel: must be None or an integer >= 1"):
                c.init_model(SPEC, out_dir=tmp_path, parallel=bad, **SHARDED)
