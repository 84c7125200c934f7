"""Writing to object storage and splitting one checkpoint into parts.
Each case runs on every store the ``store`` fixture offers (tests/support/stores.py): S3 (moto's server,
tests/support/s3_server.py) and Azure Blob Storage (Azurite, tests/support/azure_server.py), real servers on
loopback reached through the real libraries.

- A prefix written embedded, through a server and fanned out holds exactly the bytes of the
  local folder of the same request (modelinit.json included).
- Parts: N = 1..4 writers, in any order, concurrently in separate processes, leave exactly the
  objects of one writer; a prefix with a missing part has no manifest; `modelinit finalize`;
  two parts finalizing at once write each small file once.
- A run killed mid-upload leaves no visible shard; the rerun uploads only what was missing and
  leaves no upload open (S3: it aborts the killed one; Azure: committing the shard drops the
  killed try's blocks).
- Mistakes are one line with the CLI's exit code, in the store's own words and settings, nothing
  written: bucket or container missing, wrong key, endpoint down, the extra not installed,
  foreign objects (unless --overwrite).
- Every store reports an object's e_tag alike when it is written and when it is listed (a local
  folder too).
- S3 only: a store that refuses checksum headers (boto3#4392), or conditional writes, still gets
  the same objects.
"""
from __future__ import annotations

import json
import os
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

from tests.support import REPO, TINY
from tests.support.stores import KINDS, open_store

pytest.importorskip("obstore")

SPEC = TINY["gpt2"]
SHARDED = {"seed": 3, "max_shard_size": "200KB"}  # 5 shards, the index, config.json


def local(tmp_path, **request) -> dict[str, bytes]:
    out = tmp_path / "local"
    with modelinit.Client() as c:
        c.init_model(SPEC, out_dir=out, **request)
    return {p.name: p.read_bytes() for p in out.iterdir() if not p.name.startswith(".")}


@pytest.fixture()
def expected(tmp_path):
    return local(tmp_path, **SHARDED)


# -- one writer -----------------------------------------------------------------------------------


def test_embedded_upload_equals_the_local_folder(store, expected):
    url = store.new_prefix("ckpt")
    with modelinit.Client() as c:
        result = c.init_model(SPEC, out_dir=f"{url}/", **SHARDED)
    assert result.complete and result.path == url
    assert store.objects(url) == expected  # modelinit.json too; no hidden record left
    assert store.pending_uploads(url) == []
    with modelinit.Client() as c:  # a rerun finds it complete (re-hashed) and writes nothing
        again = c.init_model(SPEC, out_dir=url, **SHARDED)
    assert again.reused


def test_embedded_parallel_uploads_equal_the_local_folder(store, expected):
    """Embedded, ``parallel`` shards at once (each its own producer, SHA-256 and multipart upload)."""
    url = store.new_prefix("par")
    with modelinit.Client() as c:
        result = c.init_model(SPEC, out_dir=url, parallel=3, **SHARDED)
    assert result.complete
    assert store.objects(url) == expected
    assert store.pending_uploads(url) == []


def test_served_and_fanned_out_uploads_equal_the_local_folder(store, server_target, expected):
    for target, parallel in ((server_target, 1), (f"{server_target},{server_target}", 3)):
        url = store.new_prefix()
        with modelinit.Client(target) as c:
            c.init_model(SPEC, out_dir=url, parallel=parallel, **SHARDED)
        assert store.objects(url) == expected


def test_cli_writes_the_prefix(store, expected, tmp_path, capsys):
    url = store.new_prefix()
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    assert main(["init", str(spec), "--seed", "3", "--max-shard-size", "200KB", "--out", url, "--quiet"]) == 0
    assert f"to {url};" in capsys.readouterr().out
    assert store.objects(url) == expected


def test_an_abfss_url_names_the_container_at_its_account(azure_env, expected, capsys):
    """Azure only: ``abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PREFIX`` (the Data Lake form)
    writes what ``az://CONTAINER/PREFIX`` does; under the emulator the account is Azurite's."""
    container = azure_env.new_container()
    url = f"abfss://{container}@devstoreaccount1.dfs.core.windows.net/m"
    with modelinit.Client() as c:
        result = c.init_model(SPEC, out_dir=url, **SHARDED)
    assert result.complete
    assert azure_env.blobs(container, "m/") == expected
    assert main(["verify", url, "--no-regenerate"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("ok: 7 files verified")


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
def test_parts_in_any_order_give_the_objects_of_one_writer(store, expected, count):
    url = store.new_prefix()
    order = list(range(count))[::-1] if count % 2 else list(range(count))
    with modelinit.Client() as c:
        for n, k in enumerate(order):
            result = c.init_model(SPEC, out_dir=url, part=(k, count), **SHARDED)
            last = n == count - 1
            assert result.complete == last
            if not last:
                assert "modelinit.json" not in store.objects(url)  # a prefix with a missing part has no manifest
    assert store.objects(url) == expected


def _cli(args: list[str], env: dict[str, str], prelude: str = "") -> subprocess.Popen:
    """``modelinit ARGS`` in its own process (``prelude``: Python run first, in that process)."""
    code = textwrap.dedent(prelude) + "\nimport sys\nfrom modelinit.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.Popen([sys.executable, "-c", code, *args], env={**os.environ, **env}, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_parts_written_at_once_by_separate_processes(store, expected, tmp_path):
    url = store.new_prefix()
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    procs = [_cli(["init", str(spec), "--seed", "3", "--max-shard-size", "200KB", "--out", url,
                   "--part", f"{k}/3", "--quiet", "--device", "cpu"], store.env) for k in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert store.objects(url) == expected


def _never_finalized(*missing_parts: int):
    """A stand-in for ``prefix_writer.finalize`` that finds ``missing_parts`` unfinished and
    writes nothing (this part's own shards all there): the parts never finalize themselves."""
    from modelinit.destinations import prefix as prefix_writer

    return lambda *a: prefix_writer.Finalized(None, list(missing_parts), [])


def test_finalize_is_a_last_step_for_schedulers(store, expected, tmp_path, monkeypatch, capsys):
    url = store.new_prefix()
    from modelinit.destinations import prefix as prefix_writer

    real = prefix_writer.finalize
    monkeypatch.setattr(prefix_writer, "finalize", _never_finalized(9))
    with modelinit.Client() as c:
        c.init_model(SPEC, out_dir=url, part=(0, 2), **SHARDED)
        assert main(["finalize", url]) == 3  # part 1 missing: nothing written, try again later
        assert "part(s) 9 not finished yet" in capsys.readouterr().err
        c.init_model(SPEC, out_dir=url, part=(1, 2), **SHARDED)
    monkeypatch.setattr(prefix_writer, "finalize", real)
    assert "modelinit.json" not in store.objects(url)
    assert main(["finalize", url]) == 0
    assert "complete:" in capsys.readouterr().out
    assert store.objects(url) == expected
    assert main(["finalize", url.rpartition("/")[0] + "/empty"]) == 2
    assert "nothing to finalize" in capsys.readouterr().err


def test_finalize_with_a_part_missing_writes_nothing(store, capsys):
    url = store.new_prefix()
    with modelinit.Client() as c:
        c.init_model(SPEC, out_dir=url, part=(1, 3), **SHARDED)
    before = store.objects(url)
    assert main(["finalize", url]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "part(s) 0, 2 not finished yet" in err[0]
    assert store.objects(url) == before


def test_parts_into_a_shared_local_folder(tmp_path, expected):
    out = tmp_path / "shared"
    with modelinit.Client() as c:
        for k in (1, 0):
            c.init_model(SPEC, out_dir=out, part=(k, 2), **SHARDED)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == expected


# -- interruptions --------------------------------------------------------------------------------

#: Kills its own process (SIGKILL: no cleanup runs) in the middle of its N-th shard's upload
#: (``$DIE_IN_SHARD``, default 2): once a part of it is stored and before the upload completes.
#: Parts are 5 MiB (S3's smallest; Azure's blocks have none) and go out one at a time, so the
#: uploader asks for the chunk after the one that followed the first full part only once that part
#: is stored (obstore waits for room before it takes each chunk it was handed); the kill comes as
#: it asks. Stores that create an upload before its first part (S3) hold it from the start; Azure
#: holds nothing of an upload until a block is stored.
_DIE_MID_UPLOAD = """
import os, signal
die_in = int(os.environ.get("DIE_IN_SHARD", "2"))
from modelinit import bucket
from modelinit.destinations import prefix as prefix_writer
bucket.PART_BYTES = 5 << 20
bucket.PARTS_IN_FLIGHT = 1
real = prefix_writer._file_chunks
shards = []
def dying(events, check, first, progress, done):
    shards.append(first.name)
    sent, given, filled = 0, 0, None
    for chunk in real(events, check, first, progress, done):
        sent += memoryview(chunk).nbytes
        yield chunk
        given += 1  # the uploader is asking for more
        if filled is None and sent >= bucket.PART_BYTES:
            filled = given  # the chunk that filled the first part: it went out with it
        if len(shards) == die_in and filled is not None and given > filled:
            os.kill(os.getpid(), signal.SIGKILL)  # the first part is stored: the uploader waited for it
prefix_writer._file_chunks = dying
"""

BIG = {"model_type": "llama", "vocab_size": 8000, "hidden_size": 512, "num_hidden_layers": 1, "num_attention_heads": 4,
       "num_key_value_heads": 2, "intermediate_size": 1024, "max_position_embeddings": 128, "tie_word_embeddings": False}


@pytest.mark.slow
def test_a_killed_upload_leaves_no_shard_and_the_rerun_only_uploads_what_is_missing(store, tmp_path, monkeypatch):
    spec = tmp_path / "big.json"
    spec.write_text(json.dumps(BIG))
    url = store.new_prefix()
    args = ["init", str(spec), "--max-shard-size", "12MB", "--out", url, "--quiet", "--device", "cpu"]
    proc = _cli(args, store.env, _DIE_MID_UPLOAD)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, err
    with modelinit.Client() as c:
        plan = c.plan(str(spec), max_shard_size="12MB")
    names = [f.name for f in plan.files]
    left = store.objects(url)
    assert set(left) == {names[0], ".modelinit.progress.json"}  # the first shard, recorded; nothing half-visible
    assert store.pending_uploads(url) == [names[1]]  # the killed shard's parts (blocks), stored and billed
    from modelinit.bucket import Bucket

    uploaded: list[str] = []
    real_upload = Bucket.upload

    def counting(self, name, chunks):
        uploaded.append(name)
        return real_upload(self, name, chunks)

    monkeypatch.setattr(Bucket, "upload", counting)
    with modelinit.Client() as c:
        result = c.init_model(str(spec), seed=0, out_dir=url, max_shard_size="12MB")
    assert result.kept == (names[0],) and uploaded == names[1:]  # the finished shard is not uploaded again
    assert store.pending_uploads(url) == []  # S3: aborted by the rerun; Azure: dropped when the shard was committed
    with modelinit.Client() as c:
        clean = c.init_model(str(spec), seed=0, out_dir=tmp_path / "local", max_shard_size="12MB")
    assert store.objects(url) == {f.name: (tmp_path / "local" / f.name).read_bytes()
                                  for f in [*clean.files]} | {"modelinit.json": (tmp_path / "local" / "modelinit.json").read_bytes()}


def test_a_failed_check_aborts_the_upload(store, monkeypatch):
    """A stream that goes wrong mid-shard (here: the producer's SHA-256 disagrees) aborts that
    shard's multipart upload: no object, no parts left (S3); the error is the stream's."""
    from modelinit import stream

    real_end = stream.StreamCheck.end

    def wrong(self, event):
        if self.index == 2:
            raise ModelInitError(grpc.StatusCode.DATA_LOSS, "model-00003: SHA-256 mismatch (test)")
        return real_end(self, event)

    monkeypatch.setattr(stream.StreamCheck, "end", wrong)
    url = store.new_prefix()
    with modelinit.Client() as c, pytest.raises(ModelInitError) as e:
        c.init_model(SPEC, out_dir=url, **SHARDED)
    assert e.value.code == grpc.StatusCode.DATA_LOSS
    left = store.objects(url)
    assert sorted(left) == [".modelinit.progress.json", "model-00001-of-00005.safetensors", "model-00002-of-00005.safetensors"]
    if store.kind != "azure":  # Azure has no abort: the failed shard's staged blocks stay uncommitted, invisible,
        # until a commit of that blob (the rerun's) or the service's own expiry (7 days) drops them
        assert store.pending_uploads(url) == []


# -- what is already there ------------------------------------------------------------------------


def test_foreign_objects_are_refused_unless_overwrite(store, expected):
    url = store.new_prefix()
    store.put(url, "pytorch_model.bin", b"theirs")
    store.put(url, "tokenizer.json", b"{}")
    with modelinit.Client() as c:
        with pytest.raises(ModelInitError) as e:
            c.init_model(SPEC, out_dir=url, **SHARDED)
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and "pytorch_model.bin" in e.value.details
        assert sorted(store.objects(url)) == ["pytorch_model.bin", "tokenizer.json"]  # nothing touched
        c.init_model(SPEC, out_dir=url, overwrite=True, **SHARDED)
    assert store.objects(url) == {**expected, "tokenizer.json": b"{}"}


def test_a_rerun_with_other_weights_replaces_the_earlier_run(store, tmp_path):
    url = store.new_prefix()
    with modelinit.Client() as c:
        c.init_model(SPEC, out_dir=url, seed=1, max_shard_size="100KB")  # more shards than the next run
        c.init_model(SPEC, out_dir=url, **SHARDED)
    assert store.objects(url) == local(tmp_path, **SHARDED)


# -- mistakes -------------------------------------------------------------------------------------


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("modelinit: error: "), err
    return err[0]


#: What every store's settings start with: a hint names its own store's, never another's.
SETTINGS = {"s3": "AWS_", "azure": "AZURE", "gs": "GOOGLE_"}


def _names_only_its_own_settings(store, line: str) -> None:
    assert not [p for k, p in SETTINGS.items() if k != store.kind and p in line], line


def test_a_missing_bucket_is_one_line(store, tmp_path, capsys):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    url = store.missing_container_url()
    assert main(["init", str(spec), "--out", url, "--quiet"]) == 1
    line = _one_line_error(capsys)
    assert f"{store.container} {store.split(url)[0]!r} does not exist" in line  # bucket '...' / container '...'
    _names_only_its_own_settings(store, line)


def test_a_wrong_key_is_one_line_and_writes_nothing(store, tmp_path, capsys, monkeypatch):
    url = store.new_prefix()
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    with store.wrong_credentials(monkeypatch) as wrong:
        assert main(["init", str(spec), "--out", url, "--quiet"]) == 1
    line = _one_line_error(capsys)
    assert f"access denied ({wrong.code})" in line and not [s for s in wrong.secrets if s in line]
    assert f"check the credentials ({store.credential_prefix}" in line  # AWS_ACCESS_KEY_ID / AZURE_STORAGE_ACCOUNT_NAME
    _names_only_its_own_settings(store, line)
    assert wrong.denied and store.objects(url) == {}


def test_an_unreachable_endpoint_is_one_line(store, tmp_path, capsys, monkeypatch):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    with store.unreachable(monkeypatch) as setting:  # AWS_ENDPOINT_URL / AZURITE_BLOB_STORAGE_URL
        assert main(["init", str(spec), "--out", f"{store.scheme}://{store.container}-x/m", "--quiet"]) == 1
    line = _one_line_error(capsys)
    assert "cannot reach the store" in line and setting in line
    _names_only_its_own_settings(store, line)


def test_the_missing_extra_is_named(store, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    proc = _cli(["init", str(spec), "--out", f"{store.scheme}://b/m", "--quiet"], store.env,
                "import sys; sys.modules['obstore'] = None")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert err.strip() == ("modelinit: error: writing to object storage needs the object-store extra: "
                           "install modelinit with the 'cloud' extra (from a clone: pip install -e '.[cloud]'; "
                           "docs/install.md)")
    assert not (tmp_path / f"{store.scheme}:").exists()


# -- stores without an extension ------------------------------------------------------------------


def test_a_store_that_refuses_checksum_headers_gets_the_same_objects(s3_no_checksums, expected, caplog):
    server, refused = s3_no_checksums
    bucket = server.new_bucket()
    with modelinit.Client() as c, caplog.at_level("WARNING", "modelinit.client"):
        c.init_model(SPEC, out_dir=f"s3://{bucket}/m", **SHARDED)
    assert refused  # it was asked with checksums first
    assert "refused checksum headers" in caplog.text
    assert server.keys(bucket, "m") == expected


def test_a_reused_buffer_is_uploaded_as_it_was_passed(store, monkeypatch):
    """The embedded engine reuses its segment buffers a few events later; obstore keeps the buffers
    it is given until their part is sent. Each part must hold the bytes as they were passed."""
    from modelinit.destinations import prefix as prefix_writer
    from modelinit.bucket import Bucket
    from modelinit_wire.events import Begin, Data, End
    from modelinit_wire.v1 import modelinit_pb2 as pb

    monkeypatch.setattr("modelinit.bucket.PART_BYTES", 5 << 20)  # S3's smallest part (Azure has none): 3 in flight
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

    url = store.new_prefix()
    (result,) = prefix_writer.upload_files(Bucket(url), Reusing(), plan, [0], lambda n: None)
    data = store.objects(url)["model.safetensors"]
    assert data == b"".join(bytes([i]) * segment for i in range(size // segment))
    import hashlib

    assert result.sha256 == hashlib.sha256(data).hexdigest()


def test_two_parts_finishing_at_once_write_the_manifest_once(store, expected, monkeypatch):
    """Both find every part there and race to finalize: the conditional create lets one write each
    small file and the manifest; the other finds the same bytes. Both report complete."""
    import threading

    from modelinit.destinations import prefix as prefix_writer

    url = store.new_prefix()
    real = prefix_writer.finalize
    monkeypatch.setattr(prefix_writer, "finalize", _never_finalized())
    with modelinit.Client() as c:
        for k in range(2):
            c.init_model(SPEC, out_dir=url, part=(k, 2), **SHARDED)
    monkeypatch.setattr(prefix_writer, "finalize", real)
    created: list[str] = []
    real_create = prefix_writer._create_once

    def counting(bucket, name, data):
        wrote = real_create(bucket, name, data)
        if wrote:
            created.append(name)
        return wrote

    monkeypatch.setattr(prefix_writer, "_create_once", counting)
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
    assert store.objects(url) == expected


@pytest.mark.slow
def test_a_store_without_conditional_writes_still_gets_one_checkpoint(s3_no_conditional_put, expected, caplog):
    server, refused = s3_no_conditional_put
    bucket = server.new_bucket()
    with modelinit.Client() as c, caplog.at_level("WARNING", "modelinit.client"):
        for k in (1, 0):
            c.init_model(SPEC, out_dir=f"s3://{bucket}/m", part=(k, 2), **SHARDED)
    assert refused and "no conditional create" in caplog.text
    assert server.keys(bucket, "m") == expected


@pytest.mark.parametrize("url", ["s3://AKIAXXXX:topsecret@bucket/p", "az://account:topsecret@container/p"], ids=KINDS)
def test_credentials_in_the_url_are_refused_without_echoing_them(capsys, tmp_path, url):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    assert main(["init", str(spec), "--out", url, "--quiet"]) == 2
    line = _one_line_error(capsys)
    assert "credentials in the URL are not taken" in line and "topsecret" not in line


@pytest.mark.slow
def test_a_part_killed_mid_upload_and_rerun_completes_the_checkpoint(store, tmp_path):
    """Three parts in separate processes; part 1 is killed mid-upload of its shard (SIGKILL). The
    others finish but cannot write the manifest; part 1's rerun uploads that shard again (S3:
    aborting the open upload first) and, as the last part, writes the index, config and manifest:
    exactly one writer's objects, no upload left open."""
    spec = tmp_path / "big.json"
    spec.write_text(json.dumps(BIG))
    url = store.new_prefix()
    args = ["init", str(spec), "--max-shard-size", "12MB", "--out", url, "--quiet", "--device", "cpu"]
    killed = _cli([*args, "--part", "1/3"], {**store.env, "DIE_IN_SHARD": "1"}, _DIE_MID_UPLOAD)
    _, err = killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL, err
    assert store.pending_uploads(url)  # its shard's parts (blocks)
    others = [_cli([*args, "--part", f"{k}/3"], store.env) for k in (2, 0)]
    for p in others:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert "not finished yet" in out
    assert "modelinit.json" not in store.objects(url)
    rerun = _cli([*args, "--part", "1/3"], store.env)
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err
    assert out.startswith("wrote ")
    assert store.pending_uploads(url) == []
    with modelinit.Client() as c:
        c.init_model(str(spec), seed=0, out_dir=tmp_path / "local", max_shard_size="12MB")
    assert store.objects(url) == {p.name: p.read_bytes() for p in (tmp_path / "local").iterdir()}


# -- e_tags ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [*KINDS, "file"])
def test_a_written_objects_e_tag_is_the_one_its_listing_reports(kind, request, monkeypatch, tmp_path):
    """The e_tag ``put`` and ``upload`` return is the one ``list`` reports for the object, on every
    store, and a local folder (``file://``, where ``--part`` writes a shared folder, as the client
    opens it): a rerun keeps a shard only when its recorded e_tag matches the listing's. (Azure
    quotes an upload's ETag header but not a listing's; S3 quotes both; a folder's is its own.)"""
    from modelinit.destinations.choose import open_prefix

    if kind == "file":
        url = (tmp_path / "m").as_uri()
    else:
        url = open_store(request, monkeypatch, kind).new_prefix()
    bucket = open_prefix(url, "out_dir")
    put = bucket.put("small.json", b"{}")
    created = bucket.put("once.json", b"[]", create=True)
    uploaded = bucket.upload("shard.safetensors", [b"a" * 1000, b"b" * 1000])
    listed = bucket.list()
    assert {n: o.e_tag for n, o in listed.items()} == {"small.json": put, "once.json": created, "shard.safetensors": uploaded}
    assert all(tag for tag in (put, created, uploaded))  # an empty tag would match anything
    assert listed["shard.safetensors"].size == 2000


def _crc64_entry(i: int) -> int:
    for _ in range(8):
        i = (i >> 1) ^ (0x9A6C9329AC4BC9B5 if i & 1 else 0)
    return i


_CRC64_TABLE = [_crc64_entry(i) for i in range(256)]


def _crc64nvme(data: bytes) -> int:
    """CRC-64/NVME (reflected polynomial 0x9A6C9329AC4BC9B5, init and xorout all ones): the
    checksum S3 keeps for a whole object (the check value of b"123456789" is 0xAE8B14860A799888)."""
    crc = 0xFFFFFFFFFFFFFFFF
    for byte in data:
        crc = _CRC64_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFFFFFFFFFF


def test_every_s3_part_carries_the_crc64nvme_the_store_checks(s3_parts_seen, expected):
    """Every part goes up with its CRC64NVME (``x-amz-checksum-crc64nvme``), the checksum S3 checks
    as it stores a part and combines into the object's, never a SHA-256 (a second pass over the
    data); each header is the CRC64NVME of the part's body, so a checking store takes them."""
    import base64

    assert _crc64nvme(b"123456789") == 0xAE8B14860A799888
    server, parts = s3_parts_seen
    bucket = server.new_bucket()
    with modelinit.Client() as c:
        c.init_model(SPEC, out_dir=f"s3://{bucket}/m", **SHARDED)
    assert server.keys(bucket, "m") == expected
    assert parts
    for headers, body in parts:
        assert not any(k.startswith("x-amz-checksum-sha") for k in headers), headers
        assert int.from_bytes(base64.b64decode(headers["x-amz-checksum-crc64nvme"]), "big") == _crc64nvme(body)
