"""Writing to object storage and splitting one checkpoint into parts (issue 19, DESIGN §6b),
against a real S3 server on loopback (moto's standalone server: tests/s3_server.py) through the
real libraries.

- An s3:// prefix written embedded, through a server and fanned out holds exactly the bytes of
  the local folder of the same request (modelinit.json included).
- Parts: N = 1..4 writers, in any order, concurrently in separate processes, leave exactly the
  objects of one writer; a prefix with a missing part has no manifest; `modelinit finalize`.
- A run killed mid-upload leaves no visible shard; the rerun aborts its open multipart uploads
  and uploads only what was missing.
- Mistakes are one line with the CLI's exit code, nothing written: bucket missing, wrong key,
  endpoint down, the extra not installed, foreign objects (unless --overwrite).
- A store that refuses checksum headers (boto3#4392) still gets the same objects.
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import grpc
import modelinit
import pytest
from modelinit.cli import main
from modelinit.errors import ModelInitError
from modelinit.parts import Part, parse_part, split_shards

from tests.conftest import TINY

pytest.importorskip("obstore")
pytest.importorskip("moto.server")

SPEC = TINY["gpt2"]
SHARDED = {"seed": 3, "max_shard_size": "200KB"}  # 5 shards, the index, config.json
REPO = pathlib.Path(__file__).resolve().parents[1]


def local(tmp_path, **request) -> dict[str, bytes]:
    out = tmp_path / "local"
    with modelinit.Client() as c:
        c.init_model(SPEC, out_dir=out, **request)
    return {p.name: p.read_bytes() for p in out.iterdir() if not p.name.startswith(".")}


@pytest.fixture()
def expected(tmp_path):
    return local(tmp_path, **SHARDED)


# -- one writer -----------------------------------------------------------------------------------


def test_embedded_upload_equals_the_local_folder(s3_env, s3_bucket, expected):
    with modelinit.Client() as c:
        result = c.init_model(SPEC, out_dir=f"s3://{s3_bucket}/ckpt/", **SHARDED)
    assert result.complete and result.path == f"s3://{s3_bucket}/ckpt"
    assert s3_env.keys(s3_bucket, "ckpt") == expected  # modelinit.json too; no hidden record left
    assert s3_env.pending_uploads(s3_bucket) == []
    with modelinit.Client() as c:  # a rerun finds it complete (re-hashed) and writes nothing
        again = c.init_model(SPEC, out_dir=f"s3://{s3_bucket}/ckpt", **SHARDED)
    assert again.reused


def test_embedded_parallel_uploads_equal_the_local_folder(s3_env, s3_bucket, expected):
    """Embedded, ``parallel`` shards at once (each its own producer, SHA-256 and multipart upload)."""
    with modelinit.Client() as c:
        result = c.init_model(SPEC, out_dir=f"s3://{s3_bucket}/par", parallel=3, **SHARDED)
    assert result.complete
    assert s3_env.keys(s3_bucket, "par") == expected
    assert s3_env.pending_uploads(s3_bucket) == []


def test_served_and_fanned_out_uploads_equal_the_local_folder(s3_env, server_target, expected):
    for target, parallel in ((server_target, 1), (f"{server_target},{server_target}", 3)):
        bucket = s3_env.new_bucket()
        with modelinit.Client(target) as c:
            c.init_model(SPEC, out_dir=f"s3://{bucket}/m", parallel=parallel, **SHARDED)
        assert s3_env.keys(bucket, "m") == expected


def test_cli_writes_the_prefix(s3_env, s3_bucket, expected, tmp_path, capsys):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    assert main(["init", str(spec), "--seed", "3", "--max-shard-size", "200KB", "--out", f"s3://{s3_bucket}/m", "--quiet"]) == 0
    assert f"to s3://{s3_bucket}/m;" in capsys.readouterr().out
    assert s3_env.keys(s3_bucket, "m") == expected


# -- parts ----------------------------------------------------------------------------------------


def test_the_split_is_byte_balanced_and_covers_every_shard_once():
    sizes = [5, 9, 1, 7, 7, 3, 2, 100]
    shard = [True] * 7 + [False]
    for n in range(1, 9):
        parts = split_shards(sizes, shard, n)
        assert sorted(i for p in parts for i in p) == list(range(7))
        loads = [sum(sizes[i] for i in p) for p in parts]
        assert max(loads) - min(loads) <= max(sizes[:7])


@pytest.mark.parametrize("value, message", [("3/3", "K must be in 0..2"), ("1/0", "1..10000"), ("a/b", "not K/N"),
                                            ((1,), "give (K, N)"), ((-1, 2), "K must be in 0..1")])
def test_a_bad_part_is_refused(value, message):
    with pytest.raises(ModelInitError) as e:
        parse_part(value)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and message in e.value.details
    assert parse_part("2/4") == Part(2, 4) == parse_part((2, 4))


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_parts_in_any_order_give_the_objects_of_one_writer(s3_env, expected, count):
    bucket = s3_env.new_bucket()
    url = f"s3://{bucket}/m"
    order = list(range(count))[::-1] if count % 2 else list(range(count))
    with modelinit.Client() as c:
        for n, k in enumerate(order):
            result = c.init_model(SPEC, out_dir=url, part=(k, count), **SHARDED)
            last = n == count - 1
            assert result.complete == last
            if not last:
                assert "modelinit.json" not in s3_env.keys(bucket, "m")  # a prefix with a missing part has no manifest
    assert s3_env.keys(bucket, "m") == expected


def _cli(args: list[str], env: dict[str, str], prelude: str = "") -> subprocess.Popen:
    """``modelinit ARGS`` in its own process (``prelude``: Python run first, in that process)."""
    code = textwrap.dedent(prelude) + "\nimport sys\nfrom modelinit.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.Popen([sys.executable, "-c", code, *args], env={**os.environ, **env}, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_parts_written_at_once_by_separate_processes(s3_server, expected, tmp_path):
    bucket = s3_server.new_bucket()
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    procs = [_cli(["init", str(spec), "--seed", "3", "--max-shard-size", "200KB", "--out", f"s3://{bucket}/m",
                   "--part", f"{k}/3", "--quiet", "--device", "cpu"], s3_server.env) for k in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert s3_server.keys(bucket, "m") == expected


def test_finalize_is_a_last_step_for_schedulers(s3_env, s3_bucket, expected, tmp_path, monkeypatch, capsys):
    url = f"s3://{s3_bucket}/m"
    from modelinit import bucket_writer

    real = bucket_writer.finalize
    monkeypatch.setattr(bucket_writer, "finalize", lambda *a: (None, [9]))  # the parts never finalize themselves
    with modelinit.Client() as c:
        c.init_model(SPEC, out_dir=url, part=(0, 2), **SHARDED)
        assert main(["finalize", url]) == 3  # part 1 missing: nothing written, try again later
        assert "part(s) 9 not finished yet" in capsys.readouterr().err
        c.init_model(SPEC, out_dir=url, part=(1, 2), **SHARDED)
    monkeypatch.setattr(bucket_writer, "finalize", real)
    assert "modelinit.json" not in s3_env.keys(s3_bucket, "m")
    assert main(["finalize", url]) == 0
    assert "complete:" in capsys.readouterr().out
    assert s3_env.keys(s3_bucket, "m") == expected
    assert main(["finalize", f"s3://{s3_bucket}/empty"]) == 2
    assert "nothing to finalize" in capsys.readouterr().err


def test_finalize_with_a_part_missing_writes_nothing(s3_env, s3_bucket, capsys):
    url = f"s3://{s3_bucket}/m"
    with modelinit.Client() as c:
        c.init_model(SPEC, out_dir=url, part=(1, 3), **SHARDED)
    before = s3_env.keys(s3_bucket, "m")
    assert main(["finalize", url]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "part(s) 0, 2 not finished yet" in err[0]
    assert s3_env.keys(s3_bucket, "m") == before


def test_parts_into_a_shared_local_folder(tmp_path, expected):
    out = tmp_path / "shared"
    with modelinit.Client() as c:
        for k in (1, 0):
            c.init_model(SPEC, out_dir=out, part=(k, 2), **SHARDED)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == expected


# -- interruptions --------------------------------------------------------------------------------

#: Kills its own process (SIGKILL: no cleanup runs) once the upload of its N-th shard
#: (``$DIE_IN_SHARD``, default 2) has passed 6 MiB, with parts of it in flight.
_DIE_MID_UPLOAD = """
import os, signal
die_in = int(os.environ.get("DIE_IN_SHARD", "2"))
from modelinit import bucket, bucket_writer
bucket.PART_BYTES = 5 << 20  # S3's smallest part: several parts of a test-sized shard
real = bucket_writer._file_chunks
shards = []
def dying(events, check, first, progress, done):
    shards.append(first.name)
    sent = 0
    for chunk in real(events, check, first, progress, done):
        sent += memoryview(chunk).nbytes
        if len(shards) == die_in and sent > (6 << 20):
            os.kill(os.getpid(), signal.SIGKILL)
        yield chunk
bucket_writer._file_chunks = dying
"""

BIG = {"model_type": "llama", "vocab_size": 8000, "hidden_size": 512, "num_hidden_layers": 1, "num_attention_heads": 4,
       "num_key_value_heads": 2, "intermediate_size": 1024, "max_position_embeddings": 128, "tie_word_embeddings": False}


def test_a_killed_upload_leaves_no_shard_and_the_rerun_only_uploads_what_is_missing(s3_env, s3_bucket, tmp_path, monkeypatch):
    spec = tmp_path / "big.json"
    spec.write_text(json.dumps(BIG))
    url = f"s3://{s3_bucket}/m"
    args = ["init", str(spec), "--max-shard-size", "20MB", "--out", url, "--quiet", "--device", "cpu"]
    proc = _cli(args, s3_env.env, _DIE_MID_UPLOAD)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, err
    with modelinit.Client() as c:
        plan = c.plan(str(spec), max_shard_size="20MB")
    names = [f.name for f in plan.files]
    left = s3_env.keys(s3_bucket, "m")
    assert set(left) == {names[0], ".modelinit.progress.json"}  # the first shard, recorded; nothing half-visible
    assert s3_env.pending_uploads(s3_bucket) == [f"m/{names[1]}"]  # the killed shard's parts, stored and billed
    from modelinit.bucket import Bucket

    uploaded: list[str] = []
    real_upload = Bucket.upload

    def counting(self, name, chunks):
        uploaded.append(name)
        return real_upload(self, name, chunks)

    monkeypatch.setattr(Bucket, "upload", counting)
    with modelinit.Client() as c:
        result = c.init_model(str(spec), seed=0, out_dir=url, max_shard_size="20MB")
    assert result.kept == (names[0],) and uploaded == names[1:]  # the finished shard is not uploaded again
    assert s3_env.pending_uploads(s3_bucket) == []
    with modelinit.Client() as c:
        clean = c.init_model(str(spec), seed=0, out_dir=tmp_path / "local", max_shard_size="20MB")
    assert s3_env.keys(s3_bucket, "m") == {f.name: (tmp_path / "local" / f.name).read_bytes()
                                           for f in [*clean.files]} | {"modelinit.json": (tmp_path / "local" / "modelinit.json").read_bytes()}


def test_a_failed_check_aborts_the_upload(s3_env, s3_bucket, monkeypatch):
    """A stream that goes wrong mid-shard (here: the producer's SHA-256 disagrees) aborts that
    shard's multipart upload: no object, no parts left; the error is the stream's."""
    from modelinit import stream

    real_end = stream.StreamCheck.end

    def wrong(self, event):
        if self.index == 2:
            raise ModelInitError(grpc.StatusCode.DATA_LOSS, "model-00003: SHA-256 mismatch (test)")
        return real_end(self, event)

    monkeypatch.setattr(stream.StreamCheck, "end", wrong)
    with modelinit.Client() as c, pytest.raises(ModelInitError) as e:
        c.init_model(SPEC, out_dir=f"s3://{s3_bucket}/m", **SHARDED)
    assert e.value.code == grpc.StatusCode.DATA_LOSS
    left = s3_env.keys(s3_bucket, "m")
    assert sorted(left) == [".modelinit.progress.json", "model-00001-of-00005.safetensors", "model-00002-of-00005.safetensors"]
    assert s3_env.pending_uploads(s3_bucket) == []


# -- what is already there ------------------------------------------------------------------------


def test_foreign_objects_are_refused_unless_overwrite(s3_env, s3_bucket, expected):
    s3_env.admin.put_object(Bucket=s3_bucket, Key="m/pytorch_model.bin", Body=b"theirs")
    s3_env.admin.put_object(Bucket=s3_bucket, Key="m/tokenizer.json", Body=b"{}")
    url = f"s3://{s3_bucket}/m"
    with modelinit.Client() as c:
        with pytest.raises(ModelInitError) as e:
            c.init_model(SPEC, out_dir=url, **SHARDED)
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and "pytorch_model.bin" in e.value.details
        assert sorted(s3_env.keys(s3_bucket, "m")) == ["pytorch_model.bin", "tokenizer.json"]  # nothing touched
        c.init_model(SPEC, out_dir=url, overwrite=True, **SHARDED)
    assert s3_env.keys(s3_bucket, "m") == {**expected, "tokenizer.json": b"{}"}


def test_a_rerun_with_other_weights_replaces_the_earlier_run(s3_env, s3_bucket, tmp_path):
    url = f"s3://{s3_bucket}/m"
    with modelinit.Client() as c:
        c.init_model(SPEC, out_dir=url, seed=1, max_shard_size="100KB")  # more shards than the next run
        c.init_model(SPEC, out_dir=url, **SHARDED)
    assert s3_env.keys(s3_bucket, "m") == local(tmp_path, **SHARDED)


# -- mistakes -------------------------------------------------------------------------------------


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("modelinit: error: "), err
    return err[0]


def test_a_missing_bucket_is_one_line(s3_env, tmp_path, capsys):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    assert main(["init", str(spec), "--out", "s3://no-such-bucket-here/m", "--quiet"]) == 1
    assert "bucket 'no-such-bucket-here' does not exist" in _one_line_error(capsys)


def test_a_wrong_key_is_one_line_and_writes_nothing(s3_checking_keys, tmp_path, capsys, monkeypatch):
    server, refused = s3_checking_keys
    bucket = server.new_bucket()
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    assert main(["init", str(spec), "--out", f"s3://{bucket}/m", "--quiet"]) == 1
    line = _one_line_error(capsys)
    assert "access denied (InvalidAccessKeyId)" in line and "wrong-secret" not in line and "AKIAWRONGKEY" not in line
    assert refused and server.keys(bucket, "m") == {}


def test_an_unreachable_endpoint_is_one_line(s3_env, tmp_path, capsys, monkeypatch):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setattr("modelinit.bucket.RETRIES", 0)
    assert main(["init", str(spec), "--out", "s3://bucket-x/m", "--quiet"]) == 1
    line = _one_line_error(capsys)
    assert "cannot reach the store" in line and "AWS_ENDPOINT_URL" in line


def test_the_missing_extra_is_named(s3_server, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    proc = _cli(["init", str(spec), "--out", "s3://b/m", "--quiet"], s3_server.env, "import sys; sys.modules['obstore'] = None")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert err.strip() == ("modelinit: error: writing to object storage needs the object-store extra: "
                           "pip install 'modelinit[cloud]'")
    assert not (tmp_path / "s3:").exists()


# -- stores without an extension ------------------------------------------------------------------


def test_a_store_that_refuses_checksum_headers_gets_the_same_objects(s3_no_checksums, expected, caplog):
    server, refused = s3_no_checksums
    bucket = server.new_bucket()
    with modelinit.Client() as c, caplog.at_level("WARNING", "modelinit.client"):
        c.init_model(SPEC, out_dir=f"s3://{bucket}/m", **SHARDED)
    assert refused  # it was asked with checksums first
    assert "refused checksum headers" in caplog.text
    assert server.keys(bucket, "m") == expected


def test_a_reused_buffer_is_uploaded_as_it_was_passed(s3_env, s3_bucket, monkeypatch):
    """The embedded engine reuses its segment buffers a few events later; obstore keeps the buffers
    it is given until their part is sent. Each part must hold the bytes as they were passed."""
    from modelinit import bucket_writer
    from modelinit.bucket import Bucket
    from modelinit_wire.events import Begin, Data, End
    from modelinit_wire.v1 import modelinit_pb2 as pb

    monkeypatch.setattr("modelinit.bucket.PART_BYTES", 5 << 20)  # S3's smallest part: 3 parts in flight
    size, segment = 12 << 20, 1 << 20
    plan = pb.PlanResponse(files=[pb.FilePlan(name="model.safetensors", size=size, shard=True)])
    ring = bytearray(segment)

    class Reusing:
        def __iter__(self):
            yield Begin(0, "model.safetensors", size)
            for i in range(size // segment):
                ring[:] = bytes([i]) * segment  # the same buffer, refilled
                yield Data(memoryview(ring))
            yield End(0, None)

        def close(self):
            pass

    (result,) = bucket_writer.upload_files(Bucket(f"s3://{s3_bucket}/m"), Reusing(), plan, [0], lambda n: None)
    data = s3_env.keys(s3_bucket, "m")["model.safetensors"]
    assert data == b"".join(bytes([i]) * segment for i in range(size // segment))
    import hashlib

    assert result.sha256 == hashlib.sha256(data).hexdigest()


def test_two_parts_finishing_at_once_write_the_manifest_once(s3_env, s3_bucket, expected, monkeypatch):
    """Both find every part there and race to finalize: the conditional create lets one write each
    small file and the manifest; the other finds the same bytes. Both report complete."""
    import threading

    from modelinit import bucket_writer

    url = f"s3://{s3_bucket}/m"
    real = bucket_writer.finalize
    monkeypatch.setattr(bucket_writer, "finalize", lambda *a: (None, []))
    with modelinit.Client() as c:
        for k in range(2):
            c.init_model(SPEC, out_dir=url, part=(k, 2), **SHARDED)
    monkeypatch.setattr(bucket_writer, "finalize", real)
    created: list[str] = []
    real_create = bucket_writer._create_once

    def counting(bucket, name, data):
        wrote = real_create(bucket, name, data)
        if wrote:
            created.append(name)
        return wrote

    monkeypatch.setattr(bucket_writer, "_create_once", counting)
    barrier = threading.Barrier(2)
    results = []

    def finish():
        with modelinit.Client() as c:
            barrier.wait()
            results.append(c.finalize(url))

    threads = [threading.Thread(target=finish) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.complete for r in results] == [True, True]
    assert sorted(created) == ["config.json", "model.safetensors.index.json", "modelinit.json"]  # each once
    assert s3_env.keys(s3_bucket, "m") == expected


def test_a_store_without_conditional_writes_still_gets_one_checkpoint(s3_no_conditional_put, expected, caplog):
    server, refused = s3_no_conditional_put
    bucket = server.new_bucket()
    with modelinit.Client() as c, caplog.at_level("WARNING", "modelinit.client"):
        for k in (1, 0):
            c.init_model(SPEC, out_dir=f"s3://{bucket}/m", part=(k, 2), **SHARDED)
    assert refused and "no conditional create" in caplog.text
    assert server.keys(bucket, "m") == expected


def test_credentials_in_the_url_are_refused_without_echoing_them(capsys, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    assert main(["init", str(spec), "--out", "s3://AKIAXXXX:topsecret@bucket/p", "--quiet"]) == 2
    line = _one_line_error(capsys)
    assert "credentials in the URL are not taken" in line and "topsecret" not in line


def test_a_part_killed_mid_upload_and_rerun_completes_the_checkpoint(s3_server, tmp_path):
    """Three parts in separate processes; part 1 is killed mid-upload of its shard (SIGKILL). The
    others finish but cannot write the manifest; part 1's rerun aborts its open upload and, as the
    last part, writes the index, config and manifest: exactly one writer's objects, no upload
    left open."""
    bucket = s3_server.new_bucket()
    spec = tmp_path / "big.json"
    spec.write_text(json.dumps(BIG))
    url = f"s3://{bucket}/m"
    args = ["init", str(spec), "--max-shard-size", "12MB", "--out", url, "--quiet", "--device", "cpu"]
    killed = _cli([*args, "--part", "1/3"], {**s3_server.env, "DIE_IN_SHARD": "1"}, _DIE_MID_UPLOAD)
    _, err = killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL, err
    assert s3_server.pending_uploads(bucket)  # its second shard's parts
    others = [_cli([*args, "--part", f"{k}/3"], s3_server.env) for k in (2, 0)]
    for p in others:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert "not finished yet" in out
    assert "modelinit.json" not in s3_server.keys(bucket, "m")
    rerun = _cli([*args, "--part", "1/3"], s3_server.env)
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err
    assert out.startswith("wrote ")
    assert s3_server.pending_uploads(bucket) == []
    with modelinit.Client() as c:
        c.init_model(str(spec), seed=0, out_dir=tmp_path / "local", max_shard_size="12MB")
    assert s3_server.keys(bucket, "m") == {p.name: p.read_bytes() for p in (tmp_path / "local").iterdir()}
