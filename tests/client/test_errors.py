"""Errors: one line, the right code, never a traceback (issue 11).

CLI: bad input exits 2 and the environment (a disk, a busy folder) exits 1, with one line
``modelinit: error: ...`` on stderr; a closed stdout (``| head``) ends quietly. Server: values
that used to escape as UNKNOWN (ZeroDivisionError, OverflowError, RecursionError) are
INVALID_ARGUMENT naming the field. Policy files: size-capped, alias bombs refused, values quoted
as short excerpts. Long globs neither pass nor stay cached.
"""
from __future__ import annotations

import errno
import fnmatch
import io
import json
import os
import subprocess
import sys

import grpc
import modelinit
import pytest
import yaml
from modelinit import cli
from modelinit.destinations.folder_lock import LOCK_FILE, FolderLock
from modelinit_wire import policy_file

from tests.support import TINY


def run(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "modelinit.cli", *args], capture_output=True, text=True, timeout=timeout)


def one_line_error(r, code: int, *needles: str) -> str:
    """Assert exit ``code`` and a single ``modelinit: error:`` line holding every needle."""
    assert r.returncode == code, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("modelinit: error: "), r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def write_policy(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# --- CLI: the output folder ---------------------------------------------------------------------


def test_out_pointing_at_a_file_is_bad_input(tmp_path):
    target = tmp_path / "weights"
    target.write_text("not a folder")
    r = run("init", "gpt2", "--out", str(target))
    one_line_error(r, 2, "--out", "is a file")
    assert target.read_text() == "not a folder"


def test_out_under_a_file_is_an_environment_error(tmp_path):
    # Root ignores permissions: a folder that cannot be created is one below a regular file.
    (tmp_path / "file").write_text("x")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY["gpt2"]))
    out = tmp_path / "file" / "out"
    r = run("init", str(cfg), "--out", str(out), "--device", "reference")
    one_line_error(r, 1, "Not a directory")
    assert r.stderr.count(str(out)) == 1, r.stderr  # the folder named once, not twice


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_out_is_an_environment_error(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY["gpt2"]))
    try:
        r = run("init", str(cfg), "--out", str(ro / "out"), "--device", "reference")
    finally:
        ro.chmod(0o700)
    one_line_error(r, 1)


def test_full_disk_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys):
    from modelinit.destinations import direct_file

    def full(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(direct_file.DirectFile, "write", full)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY["gpt2"]))
    code = cli.main(["init", str(cfg), "--out", str(tmp_path / "out"), "--quiet", "--device", "reference"])
    err = capsys.readouterr().err
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("modelinit: error: ") and "No space left on device" in lines[0]
    left = [p.name for p in (tmp_path / "out").iterdir()] if (tmp_path / "out").exists() else []
    assert not [n for n in left if n.endswith((".partial", ".safetensors")) or n == LOCK_FILE], left


def test_an_unexpected_os_error_is_one_line(monkeypatch, capsys):
    def broken(argv):
        raise PermissionError(errno.EACCES, "Permission denied", "/somewhere")

    monkeypatch.setattr(cli.entry, "_main", broken)
    assert cli.main(["plan", "gpt2"]) == 1
    assert capsys.readouterr().err == "modelinit: error: /somewhere: Permission denied\n"


def test_an_unexpected_error_is_one_line_without_a_traceback(monkeypatch, capsys):
    def bug(argv):
        raise RuntimeError("something\nwent wrong")

    monkeypatch.setattr(cli.entry, "_main", bug)
    monkeypatch.delenv("MODELINIT_DEBUG", raising=False)
    assert cli.main(["plan", "gpt2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("modelinit: error: unexpected RuntimeError: something went wrong") and err.count("\n") == 1
    monkeypatch.setenv("MODELINIT_DEBUG", "1")
    with pytest.raises(RuntimeError):
        cli.main(["plan", "gpt2"])


# --- CLI: a closed stdout -----------------------------------------------------------------------


@pytest.mark.slow
def test_output_piped_into_head_ends_quietly():
    # mixtral's plan is ~180 KB: far more than a pipe holds, so the writes meet the closed pipe.
    proc = subprocess.Popen([sys.executable, "-m", "modelinit.cli", "plan", "mixtral-8x7b"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()  # what `| head -1` does
    stderr = proc.stderr.read().decode()
    code = proc.wait(timeout=120)
    assert first.startswith(b"MixtralForCausalLM")
    assert code == cli.EXIT_BROKEN_PIPE and stderr == "", stderr


def test_broken_pipe_in_process_returns_141(monkeypatch, capsys):
    class Closed(io.StringIO):
        def write(self, s):
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Closed())
    assert cli.main(["plan", "gpt2", "--no-tensors"]) == 141
    assert capsys.readouterr().err == ""


# --- CLI: policy files and sizes ----------------------------------------------------------------


@pytest.mark.parametrize("text, field", [
    ("preset: [a, b]\n", "policy.preset"),
    ("rules:\n  - match: {kinds: x}\n    init: zeros\n", "match.kinds"),
    ("rules:\n  - init: zeros\n    depth_scaling: [a, b]\n", "policy.rules[0].depth_scaling"),  # TypeError: unhashable
    ("rules:\n  - init: zeros\n    depth_scaling: {n_layers: 1}\n", "policy.rules[0].depth_scaling"),
    ("rules:\n  - match: {names: [[a]]}\n    init: zeros\n", "policy.rules[0].match.names"),
    ("rules:\n  - init: {trunc_normal: {std: 1, bounds: [sigma]}}\n", "policy.rules[0].init.trunc_normal.bounds"),
], ids=["preset-list", "kinds-string", "depth-list", "depth-map", "names-nested", "bounds-list"])
def test_policy_with_a_list_where_a_name_belongs(tmp_path, text, field):
    r = run("plan", "gpt2", "--no-tensors", "--policy", write_policy(tmp_path, "p.yaml", text))
    one_line_error(r, 2, field)


@pytest.mark.parametrize("name, text", [
    ("deep.json", "[" * 100_000 + "]" * 100_000),
    ("deep.yaml", "a: " + "[" * 100_000 + "]" * 100_000 + "\n"),
    ("deep-map.yaml", "a: " + "{a: " * 5_000 + "1" + "}" * 5_000 + "\n"),
], ids=["deep-json", "deep-yaml", "deep-map-yaml"])  # not the texts: a test's id reaches its subprocesses' environment
def test_deeply_nested_policy_is_bad_input(tmp_path, name, text):
    r = run("plan", "gpt2", "--no-tensors", "--policy", write_policy(tmp_path, name, text))
    one_line_error(r, 2, "policy", "nests too deeply")


@pytest.mark.parametrize("name, text", [
    ("big.json", '{"rules": [{"init": {"normal": {"std": 1' + "0" * 400 + "}}}]}"),
    ("big.yaml", "rules:\n  - init: {normal: {std: 1" + "0" * 400 + "}}\n"),
])
def test_400_digit_number_in_a_policy_is_bad_input(tmp_path, name, text):
    r = run("plan", "gpt2", "--no-tensors", "--policy", write_policy(tmp_path, name, text))
    line = one_line_error(r, 2, "policy.rules[0].init.normal.std", "too large")
    assert len(line) < 200, line  # the number is quoted as an excerpt


def test_400_digit_max_shard_size_is_bad_input():
    r = run("plan", "gpt2", "--no-tensors", "--max-shard-size", "1" + "0" * 400)
    line = one_line_error(r, 2, "max_shard_size")
    assert len(line) < 200, line


def test_deeply_nested_config_json_is_bad_input(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "gpt2", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    r = run("plan", str(cfg), "--no-tensors")
    one_line_error(r, 2, "spec.config", "nested deeper")


def test_yaml_alias_bomb_fails_fast(tmp_path, monkeypatch):
    # Anchors inside an allowed key, the bomb where a name belongs: quoting it in the error
    # message (or walking it) would touch 9^9 = 387,420,489 strings.
    lines = ["rules:", '  - - &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    prev = "a"
    for n in "bcdefghi":
        lines.append(f"    - &{n} [" + ", ".join([f"*{prev}"] * 9) + "]")
        prev = n
    lines.append(f"preset: *{prev}")
    path = write_policy(tmp_path, "bomb.yaml", "\n".join(lines) + "\n")
    # Fast = refused before any value is built from the node graph (counted, not timed): building
    # it is what would touch the 387 million strings.
    built = []
    construct = yaml.SafeLoader.construct_object

    def counting_construct(self, node, deep=False):
        built.append(node)
        return construct(self, node, deep)

    monkeypatch.setattr(yaml.SafeLoader, "construct_object", counting_construct)
    with pytest.raises(ValueError, match="aliases"):
        policy_file.load(path)
    assert built == [], f"{len(built)} values built before the bomb was refused"
    monkeypatch.undo()
    r = run("plan", "gpt2", "--no-tensors", "--policy", path)
    one_line_error(r, 2, "bomb.yaml", "aliases")


def test_recursive_yaml_alias_is_refused(tmp_path):
    with pytest.raises(ValueError, match="recursive"):
        policy_file.load(write_policy(tmp_path, "loop.yaml", "preset: &a [*a]\n"))


def test_yaml_aliases_within_reason_still_work(tmp_path):
    text = ("rules:\n  - match: {kinds: [norm]}\n    init: &one {constant: {value: 1.0}}\n"
            "  - match: {params: [bias]}\n    init: *one\n")
    policy = policy_file.load(write_policy(tmp_path, "ok.yaml", text))
    assert [r.init.constant.value for r in policy.rules] == [1.0, 1.0]


@pytest.mark.parametrize("name", ["huge.json", "huge.yaml"])
def test_100_mb_policy_is_refused_by_size_before_parsing(tmp_path, name, monkeypatch):
    path = tmp_path / name
    with open(path, "wb") as fh:
        fh.truncate(100 << 20)  # sparse: 100 MB without writing them
    # Before parsing (checked, not timed): neither parser is ever called.
    parsed = []
    monkeypatch.setattr(json, "loads", lambda *a, **k: parsed.append("json") or {})
    monkeypatch.setattr(yaml, "SafeLoader", lambda *a, **k: parsed.append("yaml"))
    with pytest.raises(ValueError, match="1 MiB"):
        policy_file.load(path)
    assert parsed == []
    monkeypatch.undo()
    r = run("plan", "gpt2", "--no-tensors", "--policy", str(path))
    one_line_error(r, 2, name, "1,048,576 bytes")


@pytest.mark.slow
def test_policy_errors_quote_short_excerpts(tmp_path):
    long = "x" * 100_000
    for text, field in [
        (json.dumps({"preset": [long]}), "policy.preset"),
        (json.dumps({"rules": [{"init": "zeros", "depth_scaling": long}]}), "depth_scaling"),
        (json.dumps({"rules": [{"init": long}]}), "policy.rules[0].init"),
        (json.dumps({"rules": [{"init": {long: 1}}]}), "policy.rules[0].init"),
        (json.dumps({"rules": [{"init": "zeros", long: 1}]}), "unknown key"),
        (json.dumps({"preset": long}), "policy.preset"),  # refused by the server
    ]:
        r = run("plan", "gpt2", "--no-tensors", "--policy", write_policy(tmp_path, "p.json", text))
        line = one_line_error(r, 2, field)
        assert len(line) < 400, line[:500]


# --- CLI: one init per folder -------------------------------------------------------------------


def test_second_init_into_a_busy_folder_fails_at_once(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY["gpt2"]))
    out = tmp_path / "out"
    with FolderLock(out):  # a first init, still writing
        r = run("init", str(cfg), "--out", str(out), "--device", "reference")
        one_line_error(r, 1, "another modelinit init is writing into", str(os.getpid()))
        assert not (out / "model.safetensors").exists()
    assert not (out / LOCK_FILE).exists()
    r = run("init", str(cfg), "--out", str(out), "--device", "reference")
    assert r.returncode == 0, r.stderr
    assert not (out / LOCK_FILE).exists()  # released and deleted when done


def test_folder_lock_is_exclusive_and_reusable(tmp_path):
    first = FolderLock(tmp_path / "f").acquire()
    with pytest.raises(modelinit.ModelInitError) as e:
        FolderLock(tmp_path / "f").acquire()
    assert e.value.code == grpc.StatusCode.ABORTED and str(os.getpid()) in e.value.details
    first.release()
    first.release()  # idempotent
    with FolderLock(tmp_path / "f"):
        pass
    assert list((tmp_path / "f").iterdir()) == []


def test_concurrent_api_init_into_one_folder(client, tmp_path):
    """The lock is taken by init_model itself (any caller), before anything is written."""
    out = tmp_path / "out"
    with FolderLock(out), pytest.raises(modelinit.ModelInitError) as e:
        client.init_model(TINY["gpt2"], seed=0, out_dir=out)
    assert e.value.code == grpc.StatusCode.ABORTED
    assert sorted(p.name for p in out.iterdir()) == []


# --- server: INVALID_ARGUMENT naming the field, not UNKNOWN -------------------------------------


def plan_error(client, spec=None, **kwargs) -> modelinit.ModelInitError:
    with pytest.raises(modelinit.ModelInitError) as e:
        client.plan(TINY["gpt2"] if spec is None else spec, **kwargs)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, e.value
    return e.value


def rules(*rules_: dict, preset: str = "hf-default") -> dict:
    return {"preset": preset, "rules": list(rules_)}


def test_trunc_normal_bounds_without_mass(client):
    e = plan_error(client, policy=rules({"match": {}, "init": {"trunc_normal": {"std": 0.02, "a": 40, "b": 50}}}))
    assert e.details.startswith("policy.rules[0] (rule[0]): init.trunc_normal: bounds a=40, b=50 hold no probability mass")
    assert "use bounds nearer the mean" in e.details


def test_trunc_normal_absolute_bounds_without_mass(client):
    e = plan_error(client, policy=rules({"name": "far", "match": {},
                                         "init": {"trunc_normal": {"std": 0.02, "a": 10, "b": 11, "bounds": "absolute"}}}))
    assert e.details.startswith("policy.rules[0] (far): init.trunc_normal: bounds a=10, b=11 (absolute")


def test_trunc_normal_absolute_bounds_pushed_into_a_tail_by_depth_scaling(client):
    # 5-6 sigma holds ~3e-7 of the mass; divided by sqrt(2 * 3 layers) the std puts them at 12-15 sigma.
    trunc = {"trunc_normal": {"std": 1.0, "a": 5, "b": 6, "bounds": "absolute"}}
    e = plan_error(client, policy=rules({"name": "deep", "match": {"kinds": ["linear"], "params": ["weight"]}, "init": trunc,
                                         "depth_scaling": "n_layers"}))
    assert e.details.startswith("rule 'deep': init.trunc_normal: bounds a=5, b=6 (absolute") and "no probability mass" in e.details


def test_trunc_normal_preserve_std_of_a_sliver(client):
    trunc = {"trunc_normal": {"std": 0.02, "a": 0, "b": 1e-10, "preserve_std": True}}
    e = plan_error(client, policy=rules({"name": "sliver", "match": {"kinds": ["linear"], "params": ["weight"]}, "init": trunc}))
    assert "init.trunc_normal.preserve_std" in e.details and "sliver" in e.details


def test_kaiming_huge_negative_slope(client):
    e = plan_error(client, policy=rules({"match": {"kinds": ["linear"]}, "init": {"kaiming_normal": {"negative_slope": 1e200}}}))
    assert e.details.startswith("policy.rules[0] (rule[0]): init.kaiming_normal.negative_slope: 1e+200 is too large")


def test_uniform_range_that_overflows(client):
    e = plan_error(client, policy=rules({"match": {}, "init": {"uniform": {"low": -1e308, "high": 1e308}}}))
    assert e.details.startswith("policy.rules[0] (rule[0]): init.uniform: high - low")


@pytest.mark.parametrize("size", ["1" + "0" * 400, "1" + "0" * 400 + ".5", "9" * 5000 + "GB"])
def test_huge_max_shard_size(client, size):
    e = plan_error(client, max_shard_size=size)
    assert e.details.startswith("max_shard_size: ") and "absurdly large" in e.details and len(e.details) < 200


@pytest.mark.parametrize("depth", [70, 500, 100_000])
def test_deeply_nested_config_json(client, depth):
    from modelinit_wire.v1 import modelinit_pb2 as pb

    text = '{"model_type": "gpt2", "n_layer": 2, "x": ' + "[" * depth + "]" * depth + "}"
    e = plan_error(client, spec=pb.ModelSpec(config_json=text))
    assert e.details.startswith("spec.config: nested deeper than 64 levels")


def test_config_nesting_within_the_limit_is_fine(client):
    cfg = {**TINY["gpt2"], "task_specific_params": {"a": {"b": {"c": [[[1]]]}}}}
    assert client.plan(cfg).total_params > 0


# --- server: globs and names ----------------------------------------------------------------


def test_long_glob_is_refused(client):
    e = plan_error(client, policy=rules({"match": {"names": ["*.weight", "x" * 100_000]}, "init": "zeros"}))
    assert e.details.startswith("policy.rules[0] (rule[0]): match.names[1]: a glob of 100,000 characters")
    assert len(e.details) < 300


def test_too_many_globs_are_refused(client):
    e = plan_error(client, policy=rules({"match": {"names": [f"*.h.{i}.*" for i in range(1000)]}, "init": "zeros"}))
    assert e.details.startswith("policy.rules[0] (rule[0]): match.names: 1000 values, more than 256")


def test_long_rule_name_is_refused_with_an_excerpt(client):
    e = plan_error(client, policy=rules({"name": "n" * 100_000, "match": {}, "init": "zeros"}))
    assert "name: 100,000 characters" in e.details and len(e.details) < 400


def test_unknown_kind_is_quoted_as_an_excerpt(client):
    e = plan_error(client, policy=rules({"match": {"kinds": ["k" * 100_000]}, "init": "zeros"}))
    assert e.details.startswith("policy.rules[0] (rule[0]): match.kinds: unknown 'kkk") and len(e.details) < 400


def test_globs_do_not_stay_in_fnmatchs_cache(client):
    before = fnmatch._compile_pattern.cache_info().currsize
    for i in range(20):
        glob = f"transformer.h.{i}.*" + "?" * 1000
        plan = client.plan(TINY["gpt2"], policy=rules({"match": {"names": [glob, "*.c_attn.weight"]}, "init": "zeros"}))
        assert plan.total_params > 0
    assert fnmatch._compile_pattern.cache_info().currsize == before


def test_globs_match_as_fnmatchcase():
    from modelinit_server.core.policies import Match

    class T:  # what Match.selects reads of a TensorSpec
        kind, role, param, layer = "linear", "qkv", "weight", 0

    names = ["transformer.h.0.attn.c_attn.weight", "a.b", "x[1].y", "lm_head.weight", "h.10.mlp"]
    globs = ["*", "*.weight", "transformer.h.?.*", "[!t]*", "x[[]1].y", "h.1[0-9].*", "*.b", "lm_head.weight", "[]"]
    for g in globs:
        m = Match(names=(g,))
        for n in names:
            t = T()
            t.name = n
            assert m.selects(t) == fnmatch.fnmatchcase(n, g), (g, n)


def test_the_error_pickles_as_itself():
    """A Ray task's error crosses processes pickled: it must come back as the error it was."""
    import pickle

    error = modelinit.ModelInitError(grpc.StatusCode.DATA_LOSS, "model.safetensors: SHA-256 mismatch")
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is modelinit.ModelInitError and (back.code, back.details, str(back)) == (error.code, error.details, str(error))
