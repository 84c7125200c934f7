"""DirectFile: whatever the pieces, their alignment and the filesystem, the file holds exactly the
bytes written, in order (O_DIRECT padding truncated away)."""
from __future__ import annotations

import errno
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from modelinit.destinations import direct_file
from modelinit.destinations.direct_file import ALIGN, STAGE, DirectFile


def _aligned_array(n: int, seed: int) -> np.ndarray:
    raw = np.empty(n + ALIGN, np.uint8)
    skip = -raw.ctypes.data % ALIGN
    out = raw[skip : skip + n]
    out[:] = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    return out


def _write(path, pieces, direct=True, fsync=False) -> DirectFile:
    f = DirectFile(path, direct=direct)
    for p in pieces:
        f.write(p)
    f.close(fsync)
    return f


@pytest.mark.parametrize("direct", [True, False])
def test_mixed_pieces(tmp_path, direct):
    rng = np.random.default_rng(1)
    pieces = [
        _aligned_array(2 * STAGE, 2),  # zero-copy path
        rng.integers(0, 256, 1000, dtype=np.uint8).tobytes(),  # unaligned bytes -> staged
        _aligned_array(ALIGN, 3),  # aligned, but the stage is not empty: staged
        memoryview(bytes(range(256)) * 100),
        b"",
        _aligned_array(STAGE + 17, 4)[17:],  # unaligned address
        bytearray(b"tail"),
    ]
    f = _write(tmp_path / "x", pieces, direct)
    expected = b"".join(bytes(memoryview(p).cast("B")) for p in pieces)
    assert f.size == len(expected)
    assert (tmp_path / "x").read_bytes() == expected


def test_empty_file(tmp_path):
    f = _write(tmp_path / "e", [])
    assert f.size == 0 and (tmp_path / "e").read_bytes() == b""


def test_uses_o_direct_where_available(tmp_path):
    f = DirectFile(tmp_path / "d")
    f.close()
    if not hasattr(os, "O_DIRECT"):
        assert not f.direct
    # On Linux it is True unless tmp_path's filesystem refuses O_DIRECT (tmpfs): either is fine,
    # the point of the other tests is that the bytes do not depend on it.


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 3 * ALIGN + 5), max_size=12), aligned=st.lists(st.booleans(), max_size=12))
def test_any_chunking(tmp_path_factory, sizes, aligned):
    path = tmp_path_factory.mktemp("h") / "f"
    pieces = []
    for i, n in enumerate(sizes):
        if i < len(aligned) and aligned[i]:
            pieces.append(_aligned_array(-(-n // ALIGN) * ALIGN, i))
        else:
            pieces.append(np.random.default_rng(i).integers(0, 256, n, dtype=np.uint8).tobytes())
    _write(path, pieces)
    assert path.read_bytes() == b"".join(bytes(memoryview(p).cast("B")) for p in pieces)


def test_filesystem_refusing_o_direct_falls_back(tmp_path, monkeypatch):
    flag = getattr(os, "O_DIRECT", 0)
    if not flag or direct_file.fcntl is None:
        pytest.skip("no O_DIRECT on this OS")
    real = direct_file.fcntl

    class Refusing:  # the file is created buffered, then switched: a filesystem may refuse that
        F_GETFL, F_SETFL = real.F_GETFL, real.F_SETFL

        @staticmethod
        def fcntl(fd, cmd, arg=0):
            if cmd == real.F_SETFL and arg & flag:
                raise OSError(errno.EINVAL, "Invalid argument")
            return real.fcntl(fd, cmd, arg)

    monkeypatch.setattr(direct_file, "fcntl", Refusing)
    f = _write(tmp_path / "b", [b"abc", _aligned_array(ALIGN, 0)])
    assert not f.direct
    assert (tmp_path / "b").read_bytes() == b"abc" + bytes(_aligned_array(ALIGN, 0))


def test_write_refused_midway_goes_buffered(tmp_path, monkeypatch):
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this OS")
    real_write = os.write
    calls = {"n": 0}

    def flaky(fd, data):
        calls["n"] += 1
        if calls["n"] == 2:  # a filesystem with stricter alignment rules than ours
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(direct_file.os, "write", flaky)
    a, b = _aligned_array(STAGE, 5), _aligned_array(STAGE, 6)
    f = _write(tmp_path / "m", [a, b, b"xyz"])
    if calls["n"] >= 2:
        assert not f.direct
    assert (tmp_path / "m").read_bytes() == bytes(a) + bytes(b) + b"xyz"


def test_other_errors_propagate(tmp_path):
    with pytest.raises(FileNotFoundError):
        DirectFile(tmp_path / "missing" / "f")


def test_abort_writes_nothing_staged(tmp_path):
    f = DirectFile(tmp_path / "a")
    f.write(b"staged only")
    f.abort()
    assert (tmp_path / "a").read_bytes() == b""


@pytest.mark.parametrize("direct", [True, False])
def test_an_existing_file_or_symlink_is_never_written_through(tmp_path, direct):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    (tmp_path / "link").symlink_to(victim)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for name in ("link", "dangling", "victim"):
        with pytest.raises(FileExistsError):
            DirectFile(tmp_path / name, direct=direct)
    assert victim.read_bytes() == b"keep me" and not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("direct", [True, False])
def test_a_failed_write_releases_the_staging_buffer(tmp_path, monkeypatch, direct):
    """ENOSPC while the stage is flushed: the error propagates as it is (no BufferError from a
    view a traceback still holds), and abort closes the file."""
    monkeypatch.setattr(direct_file, "STAGE", 2 * ALIGN)

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    f = DirectFile(tmp_path / "full", direct=direct)
    monkeypatch.setattr(direct_file.os, "write", full)
    with pytest.raises(OSError) as e:
        f.write(b"x" * (3 * ALIGN + 1) if f.direct else b"x")
        f.close()
    assert e.value.errno == errno.ENOSPC
    f.abort()
    assert f.fileno() == -1
