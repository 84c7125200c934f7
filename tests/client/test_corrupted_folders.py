"""A finished output folder damaged in each way a disk, a crash or another writer can, then handed to
`modelinit verify`, `modelinit init` (the same request again) and `modelinit finalize`.

The contract, for every damage and command: no traceback and no hang; stderr is empty or one
``modelinit: error:`` line; verify and finalize change nothing; init either refuses with one line and
changes nothing, or repairs the folder as docs/operations.md says a rerun does ("a complete folder one
of whose files was damaged: only that file is fetched again"), after which verify passes.
"""
from __future__ import annotations

import json
import os
import shutil
import struct

import pytest
from modelinit.cli import main
from modelinit.manifest import MAX_RECORD_BYTES

from tests.support import TINY

ARGS = ["--seed", "3", "--max-shard-size", "200KB", "--quiet", "--device", "cpu"]
MANIFEST = "modelinit.json"
PROGRESS = ".modelinit.progress.json"
INDEX = "model.safetensors.index.json"


def _shard(d):
    return d / sorted(p.name for p in d.glob("*.safetensors"))[0]


def _truncated_header(d):
    s = _shard(d)
    s.write_bytes(s.read_bytes()[:5])


def _header_length_near_2_64(d):
    s = _shard(d)
    b = bytearray(s.read_bytes())
    b[:8] = struct.pack("<Q", 2**64 - 9)
    s.write_bytes(bytes(b))


def _header_not_json(d):
    s = _shard(d)
    b = bytearray(s.read_bytes())
    (n,) = struct.unpack("<Q", b[:8])
    b[8:8 + n] = b"\xff" * n
    s.write_bytes(bytes(b))


def _json_bomb_manifest(d):
    (d / MANIFEST).write_text("[" * 100_000 + "]" * 100_000)


def _huge_manifest(d):
    with open(d / MANIFEST, "r+b") as f:  # sparse: no disk, but over the bound if it were read
        f.truncate(MAX_RECORD_BYTES + 1)


def _manifest_not_an_object(d):
    (d / MANIFEST).write_text("[1, 2]")


def _manifest_not_utf8(d):
    (d / MANIFEST).write_bytes(b'{"files": "\xff\xfe"}')


def _json_bomb_index(d):
    (d / INDEX).write_text("[" * 100_000 + "]" * 100_000)


def _shard_link_loop(d):
    s = _shard(d)
    s.unlink()
    s.symlink_to(s.name)


def _manifest_link_loop(d):
    (d / MANIFEST).unlink()
    (d / MANIFEST).symlink_to(MANIFEST)


def _shard_is_a_folder(d):
    s = _shard(d)
    s.unlink()
    s.mkdir()
    (s / "keep").write_text("someone's")


def _manifest_is_a_folder(d):
    (d / MANIFEST).unlink()
    (d / MANIFEST).mkdir()


def _shard_is_a_fifo(d):
    s = _shard(d)
    s.unlink()
    os.mkfifo(s)


def _manifest_is_a_fifo(d):  # opened for reading, a FIFO would block forever
    (d / MANIFEST).unlink()
    os.mkfifo(d / MANIFEST)


def _progress_record_is_a_fifo(d):
    os.mkfifo(d / PROGRESS)


def _json_bomb_progress_record(d):
    (d / PROGRESS).write_text('{"files": ' + "[" * 100_000 + "]" * 100_000 + "}")


DAMAGE = [_truncated_header, _header_length_near_2_64, _header_not_json, _json_bomb_manifest, _huge_manifest,
          _manifest_not_an_object, _manifest_not_utf8, _json_bomb_index, _shard_link_loop, _manifest_link_loop,
          _shard_is_a_folder, _manifest_is_a_folder, _shard_is_a_fifo, _manifest_is_a_fifo, _progress_record_is_a_fifo,
          _json_bomb_progress_record]
#: Damage to none of the files the manifest lists: verify passes.
FILES_INTACT = {_progress_record_is_a_fifo, _json_bomb_progress_record}
#: Damage init refuses (it cannot know the folder is its own, or would have to delete a folder).
REFUSED_BY_INIT = {_json_bomb_manifest, _huge_manifest, _manifest_not_an_object, _manifest_not_utf8, _manifest_link_loop,
                   _shard_is_a_folder, _manifest_is_a_folder, _manifest_is_a_fifo}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("finished")
    spec = root / "spec.json"
    spec.write_text(json.dumps(TINY["gpt2"]))
    assert main(["init", str(spec), *ARGS, "--out", str(root / "out")]) == 0
    return spec, root / "out"


def _state(d) -> dict:
    """Every entry of the folder: its kind and, for a regular file, its bytes' size and mtime."""
    out = {}
    for p in sorted(d.rglob("*")):
        st = os.lstat(p)
        out[p.relative_to(d).as_posix()] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def _one_line_or_none(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) <= 1 and all(line.startswith("modelinit: error: ") for line in lines), captured.err
    assert "Traceback" not in captured.out + captured.err
    return lines[0] if lines else ""


@pytest.mark.parametrize("damage", DAMAGE, ids=[d.__name__.strip("_") for d in DAMAGE])
@pytest.mark.parametrize("command", ["verify", "finalize", "init"])
def test_a_damaged_folder(finished, tmp_path, capsys, damage, command):
    spec, base = finished
    d = tmp_path / "out"
    shutil.copytree(base, d, symlinks=True)
    damage(d)
    before = _state(d)
    argv = {"verify": ["verify", str(d), "--no-regenerate"], "finalize": ["finalize", str(d)],
            "init": ["init", str(spec), *ARGS, "--out", str(d)]}[command]
    rc = main(argv)
    line = _one_line_or_none(capsys)
    if command == "verify":
        # 1: a report of what is bad; 2: no manifest to check against
        assert (rc == 0) if damage in FILES_INTACT else rc in (1, 2), line
        assert _state(d) == before
    elif command == "finalize":
        assert _state(d) == before  # a finished folder is left as it is; a damaged manifest is named
        assert rc == 0 or (rc == 2 and MANIFEST in line), line
    elif damage in REFUSED_BY_INIT:
        assert rc in (1, 2) and line and _state(d) == before, line
    else:
        assert rc == 0 and line == "", line  # repaired: only the damaged file fetched again
        assert main(["verify", str(d), "--no-regenerate"]) == 0
        assert _one_line_or_none(capsys) == ""


def test_a_folder_in_a_shards_place_is_named_and_kept(finished, tmp_path, capsys):
    spec, base = finished
    d = tmp_path / "out"
    shutil.copytree(base, d, symlinks=True)
    _shard_is_a_folder(d)
    assert main(["init", str(spec), *ARGS, "--out", str(d), "--overwrite"]) == 1
    line = _one_line_or_none(capsys)
    assert f"{_shard(d)} is a folder where modelinit writes a file; move it away and run again (nothing was changed)" in line
    assert (_shard(d) / "keep").read_text() == "someone's" and (d / MANIFEST).is_file()


def test_verify_names_a_shard_it_cannot_read(finished, tmp_path, capsys):
    _, base = finished
    d = tmp_path / "out"
    shutil.copytree(base, d, symlinks=True)
    _shard_link_loop(d)
    assert main(["verify", str(d), "--no-regenerate"]) == 1
    assert f"BAD  {_shard(d).name}: cannot read: Too many levels of symbolic links" in capsys.readouterr().out
