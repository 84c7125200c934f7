"""A run that did not finish never exits 0 (issue 31), on a folder and on every object store the
tests run, with or without ``--part``.

A single run ends with its ``modelinit.json`` or with a non-zero exit and one line naming what is
missing. The one success without a manifest is a ``--part`` run that finished its own share
while other parts are still running, and its line says so. The ways a run can end without a
complete checkpoint, each tried here through the CLI against the real store:

- a part missing (``--part 0/2`` alone: exit 0 saying so; ``modelinit finalize``: exit 3);
- a shard this run uploaded that is gone when it finalizes (deleted by another writer): exit 1
  naming it, whole run or part; the rerun uploads it again and completes;
- a store that refuses ``modelinit.json`` (403): exit 1 naming it; the rerun keeps the shards and
  completes; ``modelinit finalize`` against that store exits 1 too.
"""
from __future__ import annotations

import contextlib
import errno
import os
import pathlib
from dataclasses import dataclass
from typing import Callable, Iterator

import pytest
from modelinit.bucket import Bucket
from modelinit.destinations.local_prefix import LocalPrefix
from modelinit.cli import main

from tests.support.stores import CLI_ARGS as ARGS  # 5 shards, the index, config.json
from tests.support.stores import cli_expected, cli_spec  # noqa: F401 - the spec and expected fixtures

pytest.importorskip("obstore")

MANIFEST = "modelinit.json"


@dataclass
class Dest:
    """Where a run writes: a local folder or a prefix of a real store, and what a test does to it."""

    kind: str
    url: str
    objects: Callable[[], dict[str, bytes]]
    """Every object (file) under it, hidden records included, by relative name."""
    refusing_manifest: Callable[[], contextlib.AbstractContextManager]
    """While entered, writing ``modelinit.json`` there is refused (403 from the store, EACCES on a disk)."""


def _folder_objects(root: pathlib.Path) -> Callable[[], dict[str, bytes]]:
    return lambda: {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()} if root.exists() else {}


@contextlib.contextmanager
def _folder_refusing_manifest(monkeypatch) -> Iterator[None]:
    """A disk that refuses the manifest: the rename (the folder writer) and the link (the create-once
    of ``--part`` runs in a shared folder) of ``modelinit.json`` fail with EACCES."""
    real_replace, real_link = os.replace, os.link

    def refusing(real):
        def call(src, dst, *a, **kw):
            if os.fspath(dst).endswith(f"/{MANIFEST}"):
                raise PermissionError(errno.EACCES, "Permission denied", os.fspath(dst))
            return real(src, dst, *a, **kw)

        return call

    with monkeypatch.context() as m:
        m.setattr(os, "replace", refusing(real_replace))
        m.setattr(os, "link", refusing(real_link))
        yield


#: What each store answers to a write its credentials may not make.
DENIED = {"s3": "AccessDenied", "azure": "AuthorizationPermissionMismatch"}


def _refusing_manifest_put(kind: str):
    def refuse(method: str, path: str, headers) -> "tuple[int, str] | None":
        if method == "PUT" and path.split("?")[0].endswith(f"/{MANIFEST}"):
            return 403, DENIED[kind]
        return None

    return refuse


@pytest.fixture(params=["folder", "s3", "azure"])
def dest(request, tmp_path, monkeypatch) -> Dest:
    if request.param == "folder":
        out = tmp_path / "out"
        return Dest("folder", str(out), _folder_objects(out), lambda: _folder_refusing_manifest(monkeypatch))
    store = request.getfixturevalue(f"{request.param}_store")
    url = store.new_prefix("m")

    @contextlib.contextmanager
    def refusing() -> Iterator[list[str]]:
        with monkeypatch.context() as m, store.refusing(m, _refusing_manifest_put(request.param)) as refused:
            yield refused  # and the environment points at the store again after

    return Dest(request.param, url, lambda: store.objects(url), refusing)


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def _visible(objects: dict[str, bytes]) -> dict[str, bytes]:
    return {n: b for n, b in objects.items() if not n.startswith(".")}


# -- a part missing ---------------------------------------------------------------------------------


def test_a_part_that_finished_its_share_is_the_one_success_without_a_manifest(dest, spec, capsys):
    assert main(["init", spec, *ARGS, "--out", dest.url, "--part", "0/2"]) == 0
    line = _one_line(capsys.readouterr().out)
    assert line.startswith("wrote part 0/2: ") and "part(s) 1 not finished yet, so no modelinit.json yet" in line
    assert MANIFEST not in dest.objects()
    assert main(["finalize", dest.url]) == 3  # try again later
    assert "part(s) 1 not finished yet; nothing written" in _one_line(capsys.readouterr().err)
    assert MANIFEST not in dest.objects()


# -- a shard gone before the manifest ---------------------------------------------------------------


@contextlib.contextmanager
def _losing_first_upload(monkeypatch) -> Iterator[list[str]]:
    """Each process's first uploaded shard is deleted right after its upload completes, as another
    writer (or a lifecycle rule) would: the real object gone from the real store. Yields its name."""
    lost: list[str] = []

    def losing(real):
        def upload(self, name, chunks):
            tag = real(self, name, chunks)
            if not lost:
                lost.append(name)
                self.delete(name)
            return tag

        return upload

    with monkeypatch.context() as m:
        for prefix in (Bucket, LocalPrefix):  # an object store, the folder --part runs share
            m.setattr(prefix, "upload", losing(prefix.upload))
        yield lost


@pytest.mark.parametrize("part", [None, "0/2"], ids=["whole", "part"])
def test_a_shard_gone_before_the_manifest_exits_non_zero_naming_it(dest, spec, part, expected, capsys, monkeypatch):
    if dest.kind == "folder" and part is None:
        pytest.skip("a whole run into a folder writes through the folder writer, under its lock, not through uploads")
    share = ["--part", part] if part else []
    with _losing_first_upload(monkeypatch) as lost:
        assert main(["init", spec, *ARGS, "--out", dest.url, *share]) == 1
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("modelinit: error: ") and f"{MANIFEST} not written" in line and lost[0] in line, line
    assert "rerun the same command" in line
    assert MANIFEST not in dest.objects() and lost[0] not in dest.objects()
    # The rerun uploads the lost shard again and (the whole run, or part 1 after it) completes.
    assert main(["init", spec, *ARGS, "--out", dest.url, *share]) == 0
    if part:
        assert main(["init", spec, *ARGS, "--out", dest.url, "--part", "1/2"]) == 0
    assert _visible(dest.objects()) == expected


# -- the manifest refused ---------------------------------------------------------------------------


@pytest.mark.parametrize("part", [None, "1/2"], ids=["whole", "last-part"])
def test_a_store_that_refuses_the_manifest_exits_non_zero_naming_it(dest, spec, part, expected, capsys):
    if part:  # part 0 finishes first, so part 1 is the one that finalizes
        assert main(["init", spec, *ARGS, "--out", dest.url, "--part", "0/2"]) == 0
        capsys.readouterr()
    share = ["--part", part] if part else []
    with dest.refusing_manifest():
        assert main(["init", spec, *ARGS, "--out", dest.url, *share]) == 1
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("modelinit: error: ") and MANIFEST in line, line
    assert MANIFEST not in dest.objects()
    with dest.refusing_manifest():  # a scheduler's final step fails the same way
        # (a whole run into a folder leaves no part records: there is nothing to finalize, exit 2)
        assert main(["finalize", dest.url]) == (2 if dest.kind == "folder" and not part else 1)
        capsys.readouterr()
    # Once the store takes it, the rerun keeps every shard and writes the manifest.
    assert main(["init", spec, *ARGS, "--out", dest.url, *share]) == 0
    assert _visible(dest.objects()) == expected


def test_a_part_whose_store_refuses_the_manifest_keeps_its_shards(dest, spec, capsys):
    """The line names the refusal, says the written shards are kept and how to finish (rerun or
    finalize)."""
    assert main(["init", spec, *ARGS, "--out", dest.url, "--part", "0/2"]) == 0
    capsys.readouterr()
    with dest.refusing_manifest():
        assert main(["init", spec, *ARGS, "--out", dest.url, "--part", "1/2"]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "not a complete checkpoint (the written shards are kept: rerun, or `modelinit finalize" in line, line
    assert ("Permission denied" if dest.kind == "folder" else f"access denied ({DENIED[dest.kind]})") in line, line


# -- a part with no shard, racing the last writer --------------------------------------------------


def test_a_part_whose_record_lands_after_the_manifest_leaves_no_record(dest, spec, expected, monkeypatch):
    """A part with no shard to write (5 shards over 6 parts: part 5) lists the prefix before the last
    writer's ``modelinit.json``, then saves its record after that writer deleted the records (what two
    Ray tasks did, found by client/test_ray.py): it ends with the checkpoint complete and its record
    gone, not a stray ``.modelinit.part-00005-of-00006.json`` beside a complete checkpoint."""
    from modelinit.destinations.prefix import PrefixRecord

    for k in range(4):  # every writer but the last
        assert main(["init", spec, *ARGS, "--out", dest.url, "--part", f"{k}/6"]) == 0
    real_save = PrefixRecord.save
    raced: list[bool] = []

    def save(self):
        if self.part.index == 5 and not raced:  # part 5 listed the prefix; the last writer finishes meanwhile
            raced.append(True)
            with monkeypatch.context() as m:
                m.setattr(PrefixRecord, "save", real_save)
                assert main(["init", spec, *ARGS, "--out", dest.url, "--part", "4/6"]) == 0
            assert MANIFEST in dest.objects()
        real_save(self)

    monkeypatch.setattr(PrefixRecord, "save", save)
    assert main(["init", spec, *ARGS, "--out", dest.url, "--part", "5/6"]) == 0
    assert raced == [True]
    assert _visible(dest.objects()) == expected
    assert [n for n in dest.objects() if n.startswith(".modelinit.part-")] == []


def test_a_part_that_lists_the_prefix_while_the_last_writer_finalizes_ends_complete(dest, spec, expected, monkeypatch):
    """A part with no shard to write (part 5 of 6) lists the prefix while the last writer finalizes
    (config.json and the index there, the records too, ``modelinit.json`` not yet), and reads the
    records after that writer deleted them: docs/ray.md's eight Ray tasks did so in a slow CI run, and
    the part refused config.json as no run's. Now a record listed and gone before it is read means
    the prefix changed under the survey: the part lists again, finds the checkpoint complete, and ends
    with it as it is."""
    from modelinit.destinations import prefix as writer

    for k in range(4):  # every writer but the last
        assert main(["init", spec, *ARGS, "--out", dest.url, "--part", f"{k}/6"]) == 0
    real_create = writer._create_once
    mid_finalize: dict = {}

    def create_once(bucket, name, data):
        if name == MANIFEST and not mid_finalize:
            mid_finalize.update(bucket.list())  # what a part listing right now sees
        return real_create(bucket, name, data)

    with monkeypatch.context() as m:
        m.setattr(writer, "_create_once", create_once)
        assert main(["init", spec, *ARGS, "--out", dest.url, "--part", "4/6"]) == 0
    assert MANIFEST not in mid_finalize and "config.json" in mid_finalize
    assert any(n.startswith(".modelinit.part-") for n in mid_finalize)
    assert MANIFEST in dest.objects() and not any(n.startswith(".modelinit.part-") for n in dest.objects())

    real_prepare = writer.prepare
    stale = [dict(mid_finalize)]  # part 5's first listing: the one taken mid-finalization

    def prepare(bucket, *a, **kw):
        real_list = bucket.list
        bucket.list = lambda: stale.pop() if stale else real_list()
        try:
            return real_prepare(bucket, *a, **kw)
        finally:
            del bucket.list

    monkeypatch.setattr(writer, "prepare", prepare)
    assert main(["init", spec, *ARGS, "--out", dest.url, "--part", "5/6"]) == 0
    assert stale == []
    assert _visible(dest.objects()) == expected
    assert [n for n in dest.objects() if n.startswith(".modelinit.part-")] == []
