"""The folder that ``--part K/N`` runs share (:class:`modelinit.destinations.local_prefix.LocalPrefix`): the
object store's interface on a local folder, written the way the folder writer writes.

- A create-once under a race: exactly one writer creates the file, whole; the others are told.
- An upload whose stream fails leaves no file and no temp file; a killed run's temp file is
  removed by the next run of that part.
- An e_tag is the file's identity: replaced by anyone, it changes.
- Three processes writing their parts at once leave the files of one writer, byte for byte.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
from modelinit.cli import main
from modelinit.destinations.local_prefix import LocalPrefix

from tests.support import REPO, TINY, read_folder


def test_a_create_once_race_has_one_winner_and_a_whole_file(tmp_path):
    prefix = LocalPrefix(tmp_path / "shared")
    data = b"x" * (1 << 20)
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def create() -> None:
        barrier.wait()
        try:
            prefix.put("modelinit.json", data, create=True)
            outcomes.append("created")
        except FileExistsError:
            outcomes.append("exists")

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["created"] + ["exists"] * 7
    assert (tmp_path / "shared" / "modelinit.json").read_bytes() == data
    assert sorted(p.name for p in (tmp_path / "shared").iterdir()) == ["modelinit.json"]  # no temp file left


def test_a_failed_upload_leaves_nothing_and_a_killed_ones_temp_file_is_removed(tmp_path):
    prefix = LocalPrefix(tmp_path)

    def failing():
        yield b"a" * 5000
        raise RuntimeError("the stream broke")

    with pytest.raises(RuntimeError, match="the stream broke"):
        prefix.upload("model-00001-of-00002.safetensors", failing())
    assert list(tmp_path.iterdir()) == []
    (tmp_path / ".model-00002-of-00002.safetensors.partial").write_bytes(b"half")  # a killed run's
    assert prefix.abort_pending(["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]) == 1
    assert list(tmp_path.iterdir()) == []


def test_an_e_tag_changes_when_anyone_replaces_the_file(tmp_path):
    prefix = LocalPrefix(tmp_path)
    tag = prefix.upload("shard.safetensors", [b"a" * 100])
    assert prefix.list()["shard.safetensors"].e_tag == tag
    (tmp_path / "other").write_bytes(b"a" * 100)
    os.replace(tmp_path / "other", tmp_path / "shard.safetensors")  # same size, same bytes, another file
    assert prefix.list()["shard.safetensors"].e_tag != tag


@pytest.mark.slow
def test_parts_written_at_once_by_separate_processes_into_one_folder(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(TINY["gpt2"]))
    args = ["init", str(spec), "--seed", "3", "--max-shard-size", "200KB", "--quiet", "--device", "cpu"]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    code = "import sys\nfrom modelinit.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    procs = [subprocess.Popen([sys.executable, "-c", code, *args, "--out", str(tmp_path / "shared"), "--part", f"{k}/3"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert read_folder(tmp_path / "shared") == read_folder(tmp_path / "one")  # no record, no temp file left


def test_a_part_with_no_shard_to_write_says_so_and_how_to_give_it_one(tmp_path, capsys, embedded):
    """A one-shard model in two parts: part 1 ends at once. It says so (a note on the CLI's stderr,
    a ModelInitWarning from the API), with the two ways to give every part a shard; it still
    exits 0 and the checkpoint is whole once part 0 is written."""
    from modelinit.errors import ModelInitWarning

    spec = tmp_path / "config.json"
    spec.write_text(json.dumps(TINY["gpt2"]))
    capsys.readouterr()
    assert main(["init", str(spec), "--part", "1/2", "--out", str(tmp_path / "shared"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("modelinit: note: part 1/2: part(s) 1 of 2 have no shard to write: the plan has 1 shard(s) "
                          "at max_shard_size 5GB; for a shard each, use at most 1 part(s), or a smaller --max-shard-size")
    assert err.count("\n") == 1
    assert main(["init", str(spec), "--part", "0/2", "--out", str(tmp_path / "shared"), "--quiet"]) == 0
    assert "note" not in capsys.readouterr().err  # part 0 has the shard
    assert (tmp_path / "shared" / "modelinit.json").exists()
    with pytest.warns(ModelInitWarning, match=r"^part 1/2: part\(s\) 1 of 2 have no shard to write"):
        embedded.init_model(spec, seed=0, part=(1, 2), out_dir=tmp_path / "api")


def test_finalize_of_a_checkpoint_its_last_part_finished_is_a_no_op(tmp_path, capsys):
    """The documented optional last step: after the last part wrote modelinit.json (and removed
    the records), `modelinit finalize` says so and exits 0, writing nothing (it exited 2)."""
    spec = tmp_path / "config.json"
    spec.write_text(json.dumps(TINY["gpt2"]))
    out = tmp_path / "shared"
    for k in (0, 1):
        assert main(["init", str(spec), "--max-shard-size", "100KB", "--part", f"{k}/2", "--out", str(out), "--quiet"]) == 0
    before = read_folder(out)
    capsys.readouterr()
    assert main(["finalize", str(out)]) == 0
    assert capsys.readouterr().out.startswith("already complete (its last part finished it; nothing written): ")
    assert read_folder(out) == before
    assert main(["finalize", str(tmp_path / "never-written")]) == 2  # an empty prefix is still an error


def test_a_part_run_again_into_a_finished_checkpoint_removes_the_records_left(tmp_path):
    """The last part's finalization stopped after modelinit.json and before its own record was deleted
    (its worker lost; Ray then runs the task again): the part run again finds the checkpoint complete
    and deletes what is left of this split's records, leaving the files of one writer."""
    spec = tmp_path / "config.json"
    spec.write_text(json.dumps(TINY["gpt2"]))
    args = ["init", str(spec), "--seed", "3", "--max-shard-size", "200KB", "--quiet", "--device", "cpu"]
    out = tmp_path / "shared"
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    assert main([*args, "--part", "2/3", "--out", str(out)]) == 0  # not last: its record stays
    record = out / ".modelinit.part-00002-of-00003.json"
    left = record.read_bytes()
    for k in (0, 1):
        assert main([*args, "--part", f"{k}/3", "--out", str(out)]) == 0  # part 1 finalizes, deleting the records
    assert read_folder(out) == read_folder(tmp_path / "one")
    record.write_bytes(left)  # as a finalization stopped before deleting it
    assert main([*args, "--part", "2/3", "--out", str(out)]) == 0
    assert read_folder(out) == read_folder(tmp_path / "one")  # no record left
