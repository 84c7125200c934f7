"""Inputs a user types or hands over as small files: a policy file (JSON or YAML), sizes, part
numbers, chunk and page sizes, tensor slices, the bearer token (its value or ``@file``), and a spec
argument naming a config.json.

Contract: the value, or a ValueError (the wire package's and the server's validation: the servicer's
INVALID_ARGUMENT, the CLI's one-line error) or a ModelInitError (the client's) naming the field; a
value returned is one the field allows."""
from __future__ import annotations

import json
import os
import pathlib
import tempfile

from .base import Reader, Target

_DIR: list[pathlib.Path] = []


def _scratch() -> pathlib.Path:
    """A folder of this process's own for the files an input becomes."""
    if not _DIR:
        _DIR.append(pathlib.Path(tempfile.mkdtemp(prefix="modelinit-fuzz-")))
    return _DIR[0]


def _name(text: str) -> str:
    """``text`` as a name inside a folder: no ``/`` (so no way out of it), at most 200 characters."""
    return text.replace("/", "_")[:200]


def _setup() -> None:
    import modelinit  # noqa: F401 - the client and the wire package
    from modelinit_server import messages  # noqa: F401 - the server's policy checks


def policy_file(data: bytes) -> None:
    from modelinit_server.messages import policy_from_pb
    from modelinit_wire import policy_file as pf

    r = Reader(data)
    kind = r.byte() % 4
    if kind == 3:  # a path of the input's own
        path = _scratch() / (_name(r.text()) or "empty")
    else:
        path = _scratch() / ("policy.json", "policy.yaml", "policy.yml")[kind]
        path.write_bytes(r.rest())
    try:
        policy = pf.load(path)
    except ValueError as e:
        assert str(e).startswith("policy"), e
        return
    try:
        policy_from_pb(policy)  # the server's checks of the values
    except ValueError:
        return
    pf.to_dict(policy)  # a policy the server takes is recorded in modelinit.json


def _size(text: str) -> None:
    from modelinit_server.core.layout import parse_size
    from modelinit_wire.sizes import MAX_SIZE, size_in_bytes

    try:
        n = size_in_bytes(text, "max_shard_size")
    except ValueError as e:
        assert str(e).startswith("max_shard_size:"), e
        return
    assert 0 < n <= MAX_SIZE and parse_size(text) == n, (text, n)


def _part(text: str) -> None:
    from modelinit import ModelInitError
    from modelinit.parts import parse_part

    try:
        part = parse_part(text)
    except ModelInitError as e:
        assert e.details.startswith("part:"), e
        return
    assert 0 <= part.index < part.count, part


def _slices(text: str) -> None:
    from modelinit import ModelInitError
    from modelinit.tensor_bytes import slice_dims

    try:
        dims = json.loads(text)
    except (ValueError, RecursionError):
        return
    try:
        slice_dims("w", dims)
    except ModelInitError as e:
        assert e.details.startswith("slices["), e


def _numbers(r: Reader) -> None:
    from modelinit_server.produce.tensor_slices import check_chunk
    from modelinit_server.messages import check_page_size

    for check in (check_chunk, check_page_size):
        n = r.int(8) - (1 << 63)  # signed, as the wire's int64/uint32 fields may hold
        try:
            check(n)
        except ValueError:
            pass


def arguments(data: bytes) -> None:
    r = Reader(data)
    which = r.byte() % 4
    if which == 3:
        _numbers(r)
        return
    text = r.text()
    (_size, _part, _slices)[which](text)


def token(data: bytes) -> None:
    from modelinit_wire.credentials import load_token

    r = Reader(data)
    kind = r.byte() % 3
    if kind == 1:
        path = _scratch() / "token"
        path.write_bytes(r.rest())
        value = f"@{path}"
    elif kind == 2:  # a path of the input's own (a NUL, a folder, one that is missing), kept inside the scratch folder
        value = f"@{_scratch()}/{_name(r.text())}"
    else:
        value = r.text()
    try:
        got = load_token(value)
    except ValueError as e:
        assert str(e).startswith("token:"), e
        return
    assert got and got.isascii() and got.isprintable() and not any(c.isspace() for c in got), repr(got)


def spec_argument(data: bytes) -> None:
    from modelinit_wire.spec_argument import Config, Preset, read_spec_argument

    r = Reader(data)
    folder = _scratch() / "spec"
    folder.mkdir(exist_ok=True)
    kind = r.byte() % 4
    if kind == 3:  # a name of the input's own, inside the scratch folder
        try:
            read_spec_argument(f"{folder}/{_name(r.text())}")
        except ValueError as e:
            assert str(e).startswith("spec:"), e
        return
    target = folder / "config.json"
    if target.is_dir():
        os.rmdir(target)
    target.unlink(missing_ok=True)
    if kind == 0:
        target.write_bytes(r.rest())
    elif kind == 1:
        target.mkdir()  # a folder where the file should be
    else:
        target.symlink_to("config.json")  # a link loop
    try:
        got = read_spec_argument(str(folder))
    except ValueError as e:
        assert str(e).startswith("spec:"), e
        return
    assert isinstance(got, (Config, Preset))


INPUT_TARGETS = (
    Target("policy_file", "a pb.Policy or ValueError('policy...'); the server's checks then take it or raise ValueError",
           policy_file, _setup, max_len=16384),
    Target("arguments", "sizes, K/N parts, tensor slices, chunk and page sizes: the value, or the field's ValueError "
                        "or ModelInitError", arguments, _setup),
    Target("token", "a printable ASCII token without whitespace, or ValueError('token: ...')", token, _setup),
    Target("spec_argument", "Config or Preset, or ValueError('spec: ...') (a config.json that is a folder, a link loop, "
                            "not UTF-8)", spec_argument, _setup),
)
