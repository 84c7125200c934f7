"""``modelinit.ray.init_model`` under a real local Ray cluster (2 CPUs): N Ray tasks, part K/N each,
write one checkpoint byte-identical to one writer's, finalized once; a task whose worker is killed
mid-part is run again by Ray (not by the test) and the checkpoint is still the same; a bad spec
fails once, before any task runs.
"""
from __future__ import annotations

import os
import pathlib
import signal
import threading
import time

import modelinit
import pytest
from modelinit.errors import ModelInitError

from tests.support import TINY, ray_cluster, read_folder

ray = pytest.importorskip("ray", reason="ray is in the test extra (modelinit[ray])")
import modelinit.ray  # noqa: E402 - after the skip: it names Ray's errors on use

#: One worker runs them all: the module's cluster is started once (a few seconds and about 1 GB).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

SPEC = TINY["gpt2"]
RUN = {"seed": 3, "max_shard_size": "100KB"}  # 10 shards
#: Big enough that a part takes a while (about 170 MB in float32, 5 MB shards), so a worker can be
#: killed while it writes.
BIGGER = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 512, "n_layer": 8, "n_head": 8,
          "vocab_size": 32768, "n_positions": 256}


@pytest.fixture(scope="module")
def _started():
    """The module's cluster, started once in a process of its own (tests/support/ray_cluster.py
    says why not by ``ray.init()`` here), and joined; or why it could not be."""
    try:
        running = ray_cluster.start(num_cpus=2)
    except ray_cluster.RayStartError as e:
        yield {"error": str(e), "reported": False}
        return
    with ray_cluster.driver_env():
        try:
            ray.init(address=running.address, log_to_driver=False,
                     runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}})
        except Exception as e:  # noqa: BLE001 - reported below as the cluster's failure, with its log
            running.stop()
            yield {"error": f"joining the cluster at {running.address} failed: {e!r}", "reported": False}
            return
        yield {"error": None, "address": running.address}
        ray.shutdown()
    running.stop(grace=2.0)  # nothing of it is kept: no need to wait out Ray's own slow shutdown (about 20 s)


@pytest.fixture()
def cluster(_started):
    """A local Ray cluster of 2 CPUs that the calls below join. A cluster that did not start fails
    the first test that needs it, with Ray's output, and skips the others (one failure, not five)."""
    if _started["error"]:
        if not _started["reported"]:
            _started["reported"] = True
            pytest.fail(f"the Ray cluster did not start: {_started['error']}", pytrace=False)
        pytest.skip("the Ray cluster did not start (the module's first Ray test failed with why)")
    yield _started["address"]


def _one_writer(tmp_path: pathlib.Path, spec, **run) -> dict[str, bytes]:
    with modelinit.Client() as c:
        c.init_model(spec, out_dir=tmp_path / "one", **run)
    return read_folder(tmp_path / "one")


def test_three_tasks_write_one_checkpoint_byte_identical_to_one_writer(cluster, tmp_path):
    result = modelinit.ray.init_model(SPEC, parts=3, out_dir=tmp_path / "out", **RUN)
    assert result.complete and not result.missing_parts
    assert read_folder(tmp_path / "out") == _one_writer(tmp_path, SPEC, **RUN)  # modelinit.json included
    assert {f.name for f in result.files} == set(read_folder(tmp_path / "out")) - {"modelinit.json"}
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".")) == []  # no records, no temp files


def _running_part_pids(out: pathlib.Path) -> list[int]:
    """Processes running a part into ``out`` right now: Ray titles a worker by its task while it runs
    one, and the worker holds a file under ``out`` open. Only those: another test's parts (the other
    pytest worker's Ray cluster, on the same machine) are not this test's to kill."""
    pids = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                title = (entry / "cmdline").read_bytes().split(b"\0")[0]
                if not title.startswith(b"ray::modelinit-part"):
                    continue
                if any(os.readlink(fd).startswith(str(out) + os.sep) for fd in (entry / "fd").iterdir()):
                    pids.append(int(entry.name))
            except OSError:  # the process ended, or a descriptor closed, while being read
                continue
    return pids


def test_a_worker_killed_mid_part_is_run_again_by_ray_and_the_checkpoint_is_the_same(cluster, tmp_path):
    """A worker is SIGKILLed while its part is being written (a shard of it in a hidden temp file):
    Ray runs the task again, and the checkpoint is byte-identical to one writer's, with no temp
    file, record or stray object left."""
    out = tmp_path / "out"
    killed: list[int] = []

    def kill_one_mid_part() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            writing = out.is_dir() and any(p.name.startswith(".") and not p.name.startswith(".modelinit")
                                           for p in out.iterdir())
            pids = _running_part_pids(out) if writing else []
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                killed.append(pids[0])
            time.sleep(0.005)

    killer = threading.Thread(target=kill_one_mid_part, daemon=True)
    killer.start()
    result = modelinit.ray.init_model(BIGGER, parts=3, out_dir=out, seed=5, max_shard_size="5MB", max_retries=2)
    killer.join(timeout=5)
    assert killed, "no part was caught mid-write"
    assert result.complete
    assert read_folder(out) == _one_writer(tmp_path, BIGGER, seed=5, max_shard_size="5MB")
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []


def test_three_tasks_write_one_checkpoint_to_a_bucket(cluster, s3_env, tmp_path):
    """The same into an S3 prefix (moto), the store's settings handed to the workers through Ray's
    runtime_env: the objects are one writer's files, and no multipart upload is left open."""
    bucket = s3_env.new_bucket()
    result = modelinit.ray.init_model(
        SPEC, parts=3, out_dir=f"s3://{bucket}/m", runtime_env={"env_vars": s3_env.env}, **RUN)
    assert result.complete and result.path == f"s3://{bucket}/m"
    assert s3_env.keys(bucket, "m") == _one_writer(tmp_path, SPEC, **RUN)
    assert s3_env.pending_uploads(bucket) == []



def test_tasks_with_no_shard_to_write_are_named_before_they_run(cluster, tmp_path):
    """One shard (the default 5GB) for three tasks: two would end at once without a word; the
    call warns first, naming them and the two fixes, and still writes the one writer's checkpoint."""
    from modelinit.errors import ModelInitWarning

    with pytest.warns(ModelInitWarning, match=r"^ray: part\(s\) 1, 2 of 3 have no shard to write: the plan has 1 shard"):
        result = modelinit.ray.init_model(SPEC, parts=3, out_dir=tmp_path / "out", seed=3)
    assert result.complete and read_folder(tmp_path / "out") == _one_writer(tmp_path, SPEC, seed=3)


def test_relative_paths_are_the_callers_and_a_tasks_error_is_the_error_it_was(cluster, tmp_path, monkeypatch):
    """The workers run elsewhere (the cluster's folder): a relative config path is read by the
    caller, a relative out_dir is the caller's folder; an error a task raises reaches the caller as
    the ModelInitError it was (it did not pickle: Ray gave an UnserializableException)."""
    import json

    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg.json").write_text(json.dumps(SPEC))
    result = modelinit.ray.init_model("cfg.json", parts=2, out_dir="out", **RUN)
    assert result.path == tmp_path / "out" and read_folder(tmp_path / "out") == _one_writer(tmp_path, SPEC, **RUN)
    (tmp_path / "a-file").write_text("not a folder")
    with pytest.raises(ModelInitError) as raised:
        modelinit.ray.init_model("cfg.json", parts=2, out_dir="a-file", **RUN)
    assert raised.value.code.name != "INTERNAL" and "Unserializable" not in raised.value.details, raised.value

def test_a_bad_spec_fails_once_before_any_task(cluster, tmp_path):
    started = time.monotonic()
    with pytest.raises(ModelInitError) as raised:
        modelinit.ray.init_model({"model_type": "no-such-model"}, parts=3, out_dir=tmp_path / "out", seed=0)
    assert raised.value.code.name == "INVALID_ARGUMENT" and "model_type" in raised.value.details
    assert "\n" not in raised.value.details
    assert not (tmp_path / "out").exists()  # no task ran
    assert time.monotonic() - started < 30
    with pytest.raises(ModelInitError, match=r"^INVALID_ARGUMENT: parts: must be an integer >= 1, got 0$"):
        modelinit.ray.init_model(SPEC, parts=0, out_dir=tmp_path / "out", seed=0)


def test_the_cli_writes_with_ray_tasks(cluster, tmp_path, capsys):
    from modelinit.cli import main

    spec = tmp_path / "spec.json"
    import json

    spec.write_text(json.dumps(SPEC))
    code = main(["init", str(spec), "--seed", "3", "--max-shard-size", "100KB", "--out", str(tmp_path / "out"),
                 "--ray", "2", "--quiet"])
    assert code == 0, capsys.readouterr()
    assert read_folder(tmp_path / "out") == _one_writer(tmp_path, SPEC, **RUN)
    assert main(["init", str(spec), "--out", str(tmp_path / "x"), "--ray", "2", "--part", "0/2"]) == 2
    assert "--ray: N >= 1 tasks write the parts themselves; not with --part" in capsys.readouterr().err
