"""The output folder never loads something else than its manifest says (issue 11).

A full disk leaves no temp file and one clean error; an earlier run's files are replaced or
removed and foreign weight files are refused unless ``overwrite``; a server cannot make the client
write past a file's planned size, through a planted link, over the manifest or under a name the
filesystem refuses; a rerun after an interrupted run keeps the files that run finished.
"""
from __future__ import annotations

import errno
import hashlib
import json
import threading

import grpc
import modelinit
import pytest
from modelinit import ModelInitError
from modelinit.cli import main
from modelinit.client import PROGRESS_FILE, RetryPolicy
from modelinit.destinations import direct_file
from modelinit.verify import verify_folder
from modelinit_wire.v1 import modelinit_pb2 as pb
from modelinit_wire.v1 import modelinit_pb2_grpc as pb_grpc

from tests.support import TINY

LOCK_FILE = ".modelinit.lock"  # another part of the client may keep it in the folder: not ours to compare
SPEC = TINY["gpt2"]
SHARDED = {"seed": 3, "max_shard_size": "200KB"}  # 5 shards, the index, config.json


def folder(path) -> dict[str, bytes]:
    """Every file (hidden ones included: leftovers show), subfolders and the lock file aside."""
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.name != LOCK_FILE and not p.is_dir()}


def _client(target: str) -> modelinit.Client:
    return modelinit.Client(target, retry=RetryPolicy(deadline=0))


@pytest.fixture()
def grpc_server(hostile):
    """Start a servicer on a free loopback port; stopped after the test (the ``hostile`` fixture of
    tests/support/hostile_server.py)."""
    return hostile


@pytest.fixture(scope="module")
def clean(server_target, tmp_path_factory):
    """A clean run's folder, per request, to compare byte for byte."""
    done: dict[str, dict[str, bytes]] = {}

    def get(**request) -> dict[str, bytes]:
        key = json.dumps(request, sort_keys=True)
        if key not in done:
            out = tmp_path_factory.mktemp("clean")
            with _client(server_target) as c:
                c.init_model(SPEC, out_dir=out, **request)
            done[key] = folder(out)
        return done[key]

    return get


# -- 1. A full disk ---------------------------------------------------------------------------


@pytest.mark.parametrize("direct_io", [True, False])
def test_disk_full_mid_file_removes_the_temp_file_and_raises_one_error(client, tmp_path, monkeypatch, direct_io):
    """ENOSPC from the writer mid-file: one ModelInitError (not BufferError from the staging
    buffer a traceback still viewed), and no hidden temp file left behind."""
    monkeypatch.setattr(direct_file, "STAGE", 64 << 10)  # the stage fills (and is flushed) mid-file
    budget = {"left": 100 << 10}
    real_os = direct_file.os

    class FullDisk:  # direct_file's os: writes 100 KiB, then the disk is full (a short write first, as a kernel does)
        def __getattr__(self, name):
            return getattr(real_os, name)

        def write(self, fd, data):
            if budget["left"] == 0:
                raise OSError(errno.ENOSPC, "No space left on device")
            with memoryview(data) as view, view[: budget["left"]] as head:
                n = real_os.write(fd, head)
            budget["left"] -= n
            return n

    monkeypatch.setattr(direct_file, "os", FullDisk())
    out = tmp_path / "out"
    with pytest.raises(ModelInitError) as e:
        client.init_model(SPEC, seed=0, out_dir=out, direct_io=direct_io)
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "No space left on device" in e.value.details and "model.safetensors" in e.value.details
    assert budget["left"] == 0  # it did fail mid-file, after writing some
    assert list(out.iterdir()) == []  # no temp file, no progress record: nothing was finished


# -- 2. Another run's files, foreign files ----------------------------------------------------


@pytest.mark.parametrize("first, second", [({"seed": 0}, SHARDED), (SHARDED, {"seed": 0})])
def test_a_run_replaces_and_removes_an_earlier_runs_files(client, clean, tmp_path, first, second):
    client.init_model(SPEC, out_dir=tmp_path, **first)
    result = client.init_model(SPEC, out_dir=tmp_path, **second)
    assert not result.reused
    assert folder(tmp_path) == clean(**second)  # nothing of the first run is left, not even model.safetensors
    report = verify_folder(tmp_path, regenerate=False)
    assert report.ok, report.problems


@pytest.mark.parametrize("name", ["model.safetensors", "pytorch_model.bin", "config.json", "model.safetensors.index.json",
                                  "model-00001-of-00002.safetensors", "tf_model.h5", "model-00003-of-00005.safetensors"])
def test_foreign_files_a_loader_reads_are_refused_unless_overwrite(client, clean, tmp_path, name):
    (tmp_path / name).write_bytes(b"someone else's weights")
    with pytest.raises(ModelInitError) as e:
        client.init_model(SPEC, out_dir=tmp_path, **SHARDED)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert name in e.value.details and "--overwrite" in e.value.details and "overwrite=True" in e.value.details
    assert folder(tmp_path) == {name: b"someone else's weights"}  # refused before anything was touched

    client.init_model(SPEC, out_dir=tmp_path, overwrite=True, **SHARDED)
    assert folder(tmp_path) == clean(**SHARDED)


def test_a_complete_folder_with_a_stray_weight_file_is_not_reused_as_it_is(client, tmp_path):
    client.init_model(SPEC, seed=0, out_dir=tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"stray")
    with pytest.raises(ModelInitError) as e:
        client.init_model(SPEC, seed=0, out_dir=tmp_path)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and "pytorch_model.bin" in e.value.details
    result = client.init_model(SPEC, seed=0, out_dir=tmp_path, overwrite=True)
    assert result.reused and not (tmp_path / "pytorch_model.bin").exists()


def test_files_no_loader_reads_are_left_alone_and_leftover_temp_files_removed(client, clean, tmp_path):
    mine = {"tokenizer.json": b"{}", "README.md": b"notes", "special_tokens_map.json": b"{}"}
    for name, data in mine.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "model.safetensors").write_bytes(b"not looked at")
    for leftover in (".model.safetensors.partial", ".model-00009-of-00009.safetensors.partial", ".modelinit.json.partial"):
        (tmp_path / leftover).write_bytes(b"half")
    client.init_model(SPEC, out_dir=tmp_path, **SHARDED)
    got = folder(tmp_path)
    assert {k: v for k, v in got.items() if k not in mine} == clean(**SHARDED)
    assert all(got[k] == v for k, v in mine.items())
    assert (tmp_path / "sub" / "model.safetensors").read_bytes() == b"not looked at"


def test_cli_overwrite(server_target, tmp_path, capsys):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"old")
    args = ["init", str(spec), "--server", server_target, "--retry-deadline", "0", "--out", str(out), "--quiet"]
    assert main(args) != 0
    err = capsys.readouterr().err
    assert "model.safetensors" in err and "--overwrite" in err
    assert (out / "model.safetensors").read_bytes() == b"old"
    assert main([*args, "--overwrite"]) == 0
    assert verify_folder(out, regenerate=False).ok


# -- 3. What a server must not make the client write --------------------------------------------


class Fake(pb_grpc.ModelInitServicer):
    """A server serving ``files`` ({name: bytes}) with the right hashes, unless told to lie:
    ``extra`` bytes appended to each file's data (in ``chunk``-sized messages), ``announce``
    a FileBegin size other than the plan's."""

    def __init__(self, files: dict[str, bytes], extra: int = 0, chunk: int = 1 << 20, announce: int | None = None,
                 planned: list[str] | None = None) -> None:
        self.files, self.extra, self.chunk, self.announce = files, extra, chunk, announce
        self.planned = planned or list(files)
        self.sent = 0

    def Plan(self, request, context):
        echoed = pb.ModelRequest()
        echoed.CopyFrom(request.request)
        echoed.max_shard_size = echoed.max_shard_size or "5000000000"  # as a server normalizes it
        return pb.PlanResponse(algorithm_version=2, fingerprint="f" * 64, request=echoed,
                               files=[pb.FilePlan(name=n, size=len(self.files[n])) for n in self.planned])

    def Init(self, request, context):
        for i, name in enumerate(self.planned):
            data = self.files[name]
            size = len(data) if self.announce is None else self.announce
            yield pb.InitResponse(begin=pb.FileBegin(index=i, name=name, size=size))
            body = data + b"\0" * self.extra
            for k in range(0, len(body), self.chunk):
                self.sent += len(body[k : k + self.chunk])
                yield pb.InitResponse(data=body[k : k + self.chunk])
            yield pb.InitResponse(end=pb.FileEnd(index=i, sha256=hashlib.sha256(data).hexdigest()))


def test_a_file_growing_past_its_planned_size_is_refused_at_once(grpc_server, tmp_path, monkeypatch):
    written = []
    real_write = direct_file.DirectFile.write
    monkeypatch.setattr(direct_file.DirectFile, "write", lambda self, data: (written.append(len(data)), real_write(self, data)))
    target = grpc_server(Fake({"model.safetensors": b"x" * 1000}, extra=64 << 20))
    with pytest.raises(ModelInitError) as e, _client(target) as c:
        c.init_model("gpt2", seed=0, out_dir=tmp_path)
    assert e.value.code == grpc.StatusCode.DATA_LOSS and "more than the 1000 bytes planned" in e.value.details
    assert sum(written) <= 1000  # not 64 MiB first and a refusal after
    assert list(tmp_path.iterdir()) == []


def test_a_begin_announcing_another_size_than_the_plan_is_refused(grpc_server, tmp_path):
    target = grpc_server(Fake({"model.safetensors": b"x" * 1000}, announce=1 << 40))
    with pytest.raises(ModelInitError) as e, _client(target) as c:
        c.init_model("gpt2", seed=0, out_dir=tmp_path)
    assert e.value.code == grpc.StatusCode.DATA_LOSS and "the plan says 1000" in e.value.details
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("direct_io", [True, False])
def test_links_planted_at_temp_names_are_not_written_through(client, clean, tmp_path, direct_io):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    out = tmp_path / "out"
    out.mkdir()
    for name in (".model.safetensors.partial", ".config.json.partial", ".modelinit.json.partial",
                 f".{PROGRESS_FILE}.partial"):
        (out / name).symlink_to(victim)
    client.init_model(SPEC, seed=0, out_dir=out, direct_io=direct_io)
    assert victim.read_bytes() == b"keep me"
    assert folder(out) == clean(seed=0) and not any(p.is_symlink() for p in out.iterdir())


@pytest.mark.parametrize("name", ["modelinit.json", "MODELINIT.JSON", ".modelinit.lock", PROGRESS_FILE,
                                  "a" * 201 + ".safetensors", "é" * 101])
def test_reserved_and_overlong_names_are_refused(grpc_server, tmp_path, name):
    target = grpc_server(Fake({name: b"{}"}))
    with pytest.raises(ModelInitError) as e, _client(target) as c:
        c.init_model("gpt2", seed=0, out_dir=tmp_path / "out")
    assert e.value.code == grpc.StatusCode.DATA_LOSS and "unsafe file name" in e.value.details
    assert list(tmp_path.iterdir()) == []


def test_a_name_of_200_bytes_is_written(grpc_server, tmp_path):
    name = "a" * 188 + ".safetensors"
    target = grpc_server(Fake({name: b"data"}))
    with _client(target) as c:
        c.init_model("gpt2", seed=0, out_dir=tmp_path)
    assert (tmp_path / name).read_bytes() == b"data"


def test_a_plan_naming_a_file_twice_is_refused(grpc_server, tmp_path):
    target = grpc_server(Fake({"model.safetensors": b"a", "Model.safetensors": b"b"},
                              planned=["model.safetensors", "Model.safetensors"]))
    with pytest.raises(ModelInitError) as e, _client(target) as c:
        c.init_model("gpt2", seed=0, out_dir=tmp_path)
    assert e.value.code == grpc.StatusCode.DATA_LOSS and "twice" in e.value.details
    assert list(tmp_path.iterdir()) == []


# -- 4. Rerun after an interrupted run ------------------------------------------------------------


class Proxy(pb_grpc.ModelInitServicer):
    """Forwards to a real server; records the files each Init asks for (all of them when
    ``files`` is empty) and, while ``cut_at`` is set, fails a stream (INTERNAL: not retried) a
    little way into that file."""

    def __init__(self, upstream: str, cut_at: int | None = None) -> None:
        self._channel = grpc.insecure_channel(upstream, options=[("grpc.max_receive_message_length", 16 << 20)])
        self._stub = pb_grpc.ModelInitStub(self._channel)
        self.cut_at = cut_at
        self.requested: list[int] = []
        self._lock = threading.Lock()

    def Plan(self, request, context):
        return self._stub.Plan(request)

    def Init(self, request, context):
        current = None
        # the list of the run this stream belongs to: a stream of an earlier run that has not yet
        # seen its cancellation must not record into the next run's list (the test resets it)
        requested = self.requested
        for msg in self._stub.Init(request):
            kind = msg.WhichOneof("event")
            if kind == "begin":
                current = msg.begin.index
                with self._lock:
                    requested.append(current)
            yield msg
            if kind == "data" and current == self.cut_at:
                context.abort(grpc.StatusCode.INTERNAL, "cut on purpose")


@pytest.fixture()
def proxies(server_target, grpc_server):
    made = []

    def start(n: int, cut_at: int | None) -> tuple[str, list[Proxy]]:
        ps = [Proxy(server_target, cut_at) for _ in range(n)]
        made.extend(ps)
        return ",".join(grpc_server(p) for p in ps), ps

    yield start
    for p in made:
        p._channel.close()


def _record(out) -> dict:
    return json.loads((out / PROGRESS_FILE).read_text())


@pytest.mark.parametrize("parallel", [1, 2])
def test_a_rerun_keeps_the_files_an_interrupted_run_finished(proxies, clean, tmp_path, parallel):
    target, ps = proxies(parallel, cut_at=3)
    with pytest.raises(ModelInitError) as e, _client(target) as c:
        c.init_model(SPEC, out_dir=tmp_path, parallel=parallel, **SHARDED)
    assert e.value.code == grpc.StatusCode.INTERNAL
    done = [f["name"] for f in _record(tmp_path)["files"]]
    if parallel == 1:  # the files before the cut one, in plan order
        assert done == ["model-00001-of-00005.safetensors", "model-00002-of-00005.safetensors", "model-00003-of-00005.safetensors"]
    assert done and "model-00004-of-00005.safetensors" not in done
    assert not (tmp_path / "modelinit.json").exists() and not any(n.endswith(".partial") for n in folder(tmp_path))

    for p in ps:
        p.cut_at, p.requested = None, []
    with _client(target) as c:
        result = c.init_model(SPEC, out_dir=tmp_path, parallel=parallel, **SHARDED)
    assert list(result.kept) == done and not result.reused
    requested = sorted(i for p in ps for i in p.requested)
    assert requested == sorted(i for i, f in enumerate(result.files) if f.name not in done)  # kept ones not asked again
    assert folder(tmp_path) == clean(**SHARDED)  # byte for byte, the progress record gone


def test_a_kept_file_whose_bytes_changed_is_fetched_again(proxies, clean, tmp_path):
    target, (p,) = proxies(1, cut_at=3)
    with pytest.raises(ModelInitError), _client(target) as c:
        c.init_model(SPEC, out_dir=tmp_path, **SHARDED)
    first = tmp_path / "model-00001-of-00005.safetensors"
    data = bytearray(first.read_bytes())
    data[-1] ^= 1  # same size, other bytes
    first.write_bytes(bytes(data))
    p.cut_at, p.requested = None, []
    with _client(target) as c:
        result = c.init_model(SPEC, out_dir=tmp_path, **SHARDED)
    assert list(result.kept) == ["model-00002-of-00005.safetensors", "model-00003-of-00005.safetensors"]
    assert sorted(p.requested) == [0, 3, 4, 5, 6]
    assert folder(tmp_path) == clean(**SHARDED)


def test_a_complete_folder_with_one_damaged_shard_fetches_only_that_one(proxies, clean, tmp_path):
    target, (p,) = proxies(1, cut_at=None)
    with _client(target) as c:
        c.init_model(SPEC, out_dir=tmp_path, **SHARDED)
        shard = tmp_path / "model-00002-of-00005.safetensors"
        shard.write_bytes(b"\0" * shard.stat().st_size)
        p.requested = []
        result = c.init_model(SPEC, out_dir=tmp_path, **SHARDED)
    assert not result.reused and len(result.kept) == len(result.files) - 1
    assert p.requested == [1]
    assert folder(tmp_path) == clean(**SHARDED)


def test_an_interrupted_run_of_other_weights_is_cleared_not_refused(proxies, clean, tmp_path):
    target, (p,) = proxies(1, cut_at=3)
    with pytest.raises(ModelInitError), _client(target) as c:
        c.init_model(SPEC, out_dir=tmp_path, **SHARDED)
    assert (tmp_path / "model-00001-of-00005.safetensors").exists()  # unrecorded, these would be "foreign"
    p.cut_at = None
    with _client(target) as c:
        result = c.init_model(SPEC, out_dir=tmp_path, seed=0)
    assert result.kept == () and folder(tmp_path) == clean(seed=0)


def test_embedded_rerun_keeps_finished_files(tmp_path, clean, monkeypatch):
    """The in-process engine produces only the files not kept."""
    from modelinit_server.service.embedded import EmbeddedService

    asked = []
    real_events = EmbeddedService.events

    def events(self, plan, selected=None):
        asked.append(None if selected is None else list(selected))
        return real_events(self, plan, selected)

    monkeypatch.setattr(EmbeddedService, "events", events)

    class Stop(Exception):
        pass

    with modelinit.Client() as c:
        plan = c.plan(SPEC, **SHARDED)
        sizes = [f.size for f in plan.files]
        seen = {"n": 0}

        def progress(n):
            seen["n"] += n
            if seen["n"] > sum(sizes[:2]):  # a little way into the third file
                raise Stop()

        with pytest.raises(Stop):
            c.init_model(SPEC, out_dir=tmp_path, progress=progress, **SHARDED)
        result = c.init_model(SPEC, out_dir=tmp_path, **SHARDED)
    assert asked == [None, [2, 3, 4, 5, 6]]
    assert len(result.kept) == 2
    assert folder(tmp_path) == clean(**SHARDED)


def test_verify_reports_what_init_calls_foreign(client, tmp_path):
    client.init_model(SPEC, seed=0, out_dir=tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"stray")
    (tmp_path / "tokenizer.json").write_bytes(b"{}")
    report = verify_folder(tmp_path, regenerate=False)
    assert report.problems == ("pytorch_model.bin: not in the manifest (left over from another run?)",)


# -- Destinations that are not a local folder ----------------------------------------------------


@pytest.mark.parametrize("url", ["hf://org/model", "http://host/prefix", "ftp://host/p"])
def test_a_url_of_no_supported_store_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys, url):
    """`--out s3://...` used to create a local folder named `s3:` and report success; s3://, gs://
    and az:// are object stores now (tests/client/test_object_store.py), any other scheme is refused."""
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    assert main(["init", str(spec), "--out", url, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    scheme = url.partition("://")[0]
    assert err == [f"modelinit: error: out_dir: {scheme}:// is not a location this version can use; "
                   "give a local folder, a file:// URL or an object-store prefix (s3://, gs://, az://)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.json"]
    assert main(["verify", url]) == 2
    assert capsys.readouterr().err.startswith(f"modelinit: error: path: {scheme}://")
    assert main(["init", "--from-manifest", url, "--out", "new", "--quiet"]) == 2
    assert capsys.readouterr().err.startswith(f"modelinit: error: from_manifest: {scheme}://")
    with modelinit.Client() as c, pytest.raises(ModelInitError) as e:
        c.init_model(SPEC, seed=1, out_dir=url)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.json"]


def test_a_file_url_is_the_local_folder(server_target, clean, tmp_path):
    with _client(server_target) as c:
        c.init_model(SPEC, out_dir=(tmp_path / "out dir").as_uri(), **SHARDED)
    assert folder(tmp_path / "out dir") == clean(**SHARDED)
    assert verify_folder((tmp_path / "out dir").as_uri(), regenerate=False).ok
    with pytest.raises(ModelInitError) as e:
        verify_folder("file://otherhost/x")
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "file:///absolute/path" in e.value.details


def test_the_embedded_job_plans_once(tmp_path, monkeypatch):
    """init_model plans the request, then streams it (one stream, files in flight, or a part and its
    small files): the engine builds the plan once, the streams take the plan made for that request."""
    from modelinit_server.service.embedded import EmbeddedService

    built = []
    real = EmbeddedService.build
    monkeypatch.setattr(EmbeddedService, "build", lambda self, msg: built.append(1) or real(self, msg))
    with modelinit.Client() as c:
        c.init_model(SPEC, out_dir=tmp_path / "one", parallel=1, **SHARDED)
        c.init_model(SPEC, out_dir=tmp_path / "two", parallel=2, **SHARDED)
        c.init_model(SPEC, out_dir=tmp_path / "part", part=(0, 2), **SHARDED)
    assert built == [1, 1, 1]
