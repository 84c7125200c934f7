"""What the client reads back from an output folder on resume, verify and finalize: a safetensors
header, ``model.safetensors.index.json``, ``modelinit.json`` and the progress records, and a whole
finished folder damaged by the input.

Contract: the readers of a shard's header and of the index report problems as text and never raise;
the manifest reader returns a well-formed manifest or raises ModelInitError(FAILED_PRECONDITION); the
record reader returns a record or None; over a damaged folder, verify, ``is_complete``, finalize and
init's survey either succeed or raise ModelInitError, and verify and finalize write nothing."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
from typing import Any

from .base import Reader, Target

FINGERPRINT = "cf21203f29fa1151"
_FOLDER: dict[str, Any] = {}
"""The finished folder (``base``), its parent (``root``), the request's config (``config``) and the
embedded client every input reuses (``client``), made once per process by :func:`_finished`."""


def safetensors_header(data: bytes) -> None:
    """The input is a whole shard, read as verify reads one (its scan keeps the head)."""
    from modelinit.file_checks import check_header
    from modelinit.verify import _Scan

    scan = _Scan("model.safetensors")
    for at in range(0, len(data), 1000):  # in pieces, as the file's reads come
        scan.feed(memoryview(data[at:at + 1000]))
    problems, header = check_header(bytes(scan.head), scan.size, FINGERPRINT)
    assert isinstance(problems, list) and all(isinstance(p, str) for p in problems)
    assert header is None or isinstance(header, dict)


def index(data: bytes) -> None:
    from modelinit.file_checks import check_index

    r = Reader(data)
    shards = {"model-00001-of-00002.safetensors": {"a.weight": 16, "b.weight": 8},
              "model-00002-of-00002.safetensors": None if r.byte() % 2 else {"c.weight": 4}}
    names = set(shards) | {"config.json", "model.safetensors.index.json"}
    present = set(list(names)[: r.byte() % (len(names) + 1)])
    problems = check_index(r.rest(), shards, names, present)
    assert isinstance(problems, list) and all(isinstance(p, str) for p in problems)


def manifest(data: bytes) -> None:
    import grpc
    from modelinit import ModelInitError
    from modelinit.manifest import manifest_request, parse_manifest, parse_record

    record = parse_record(data)
    assert record is None or isinstance(record.files, tuple)
    try:
        doc = parse_manifest(data, "modelinit.json")
    except ModelInitError as e:
        assert e.code == grpc.StatusCode.FAILED_PRECONDITION and "modelinit.json" in e.details, e
        return
    manifest_request(doc)  # a manifest that parses has a request that replays


def _finished() -> pathlib.Path:
    """A finished folder of a tiny GPT-2 in 8 shards, written once per process (the numpy reference engine,
    whose bytes are the kernels': no compile before the first input)."""
    if "base" not in _FOLDER:
        from modelinit import Client

        root = pathlib.Path(tempfile.mkdtemp(prefix="modelinit-fuzz-folder-"))
        doc = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 64, "n_embd": 16, "n_layer": 1,
               "n_head": 2, "n_positions": 32}
        client = Client(device="reference")  # kept open for the process: every input's finalize and init
        client.init_model(doc, seed=3, out_dir=root / "base", max_shard_size="4KB")
        _FOLDER.update(base=root / "base", root=root, client=client,
                       config=json.loads((root / "base" / "config.json").read_text()))
    return _FOLDER["base"]


def _damage(folder: pathlib.Path, r: Reader) -> None:
    """One to three changes the input chooses: bytes written at an offset of a file, a file cut,
    replaced by a folder, a link (to itself, or to another file), a FIFO, or removed; or a new file."""
    names = sorted(p.name for p in folder.iterdir()) + [".modelinit.progress.json", ".model-00001-of-00002.safetensors.partial"]
    for _ in range(1 + r.byte() % 3):
        path = folder / r.choice(names)
        op = r.byte() % 7
        try:
            _change(path, op, r, names)
        except OSError:  # an earlier change made this one impossible (a write through a link loop)
            pass


def _change(path: pathlib.Path, op: int, r: Reader, names: list[str]) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif op != 0:
        path.unlink(missing_ok=True)
    if op == 0:  # overwrite in place (or create)
        offset, chunk = r.int(2), r.take(1 + r.byte())
        with open(path, "r+b" if path.exists() else "wb") as f:
            f.seek(offset)
            f.write(chunk)
    elif op == 1:
        path.write_bytes(r.take(r.int(2)))
    elif op == 2:
        path.mkdir()
    elif op == 3:
        path.symlink_to(path.name)
    elif op == 4:
        path.symlink_to(r.choice(names))
    elif op == 5:
        os.mkfifo(path)
    # op 6: removed


def _state(folder: pathlib.Path) -> dict[str, tuple[int, int, int]]:
    out = {}
    for p in folder.iterdir():
        st = os.lstat(p)
        out[p.name] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def folder(data: bytes) -> None:
    from modelinit import ModelInitError
    from modelinit.verify import is_complete, verify_folder

    base = _finished()
    work = _FOLDER["root"] / "work"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base, work, symlinks=True)
    _damage(work, Reader(data))
    before = _state(work)
    try:
        verify_folder(work, regenerate=False)
    except ModelInitError:
        pass
    is_complete(work, FINGERPRINT, 2, [])
    client = _FOLDER["client"]
    try:
        client.finalize(work)
    except ModelInitError:
        pass
    assert _state(work) == before, "verify or finalize changed the folder"
    try:  # init's survey and resume: repairs what its record lists, or refuses with one error
        client.init_model(_FOLDER["config"], seed=3, out_dir=work, max_shard_size="4KB")
    except ModelInitError:
        pass


def _setup() -> None:
    import modelinit.verify  # noqa: F401


FILE_TARGETS = (
    Target("safetensors_header", "problems as text, never an exception", safetensors_header, _setup, max_len=65536),
    Target("index", "problems as text, never an exception", index, _setup, max_len=65536),
    Target("manifest", "a manifest whose request replays, or ModelInitError(FAILED_PRECONDITION) naming it; a record "
                       "or None", manifest, _setup, max_len=65536),
    Target("folder", "over a damaged finished folder: verify, is_complete, finalize and init succeed or raise "
                     "ModelInitError; verify and finalize write nothing", folder, _finished, max_len=8192),
)
