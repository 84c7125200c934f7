"""The served path's transit check (issue 34): every data message of an Init stream carries the
running CRC32C of its file's bytes, the client checks it on receipt, and a message that fails is
asked for again from the byte before it; each byte is SHA-256'd once in all, by the server.

The corruption is real: a relay between a real in-process server and the real client
(tests/support/relay.py) flips a bit of a data message, or strips the CRC as an older server
sends none.
"""
from __future__ import annotations

import hashlib
import logging

import modelinit
import pytest
from modelinit.errors import ModelInitError

from tests.support import TINY, read_folder
from tests.support.relay import flip_bit, is_data, without_crc

SPEC = TINY["gpt2"]
RUN = {"seed": 4, "dtype": "bfloat16", "max_shard_size": "60KB"}  # several shards, several messages each


@pytest.fixture(scope="module")
def expected(tmp_path_factory):
    """The files of an embedded run: what every served run below must write, byte for byte."""
    out = tmp_path_factory.mktemp("expected") / "model"
    with modelinit.Client() as c:
        c.init_model(SPEC, out_dir=out, **RUN)
    return read_folder(out)


def _data_messages(change_at):
    """A change that applies ``change_at(call, n)`` to the ``n``-th data message of each Init call."""
    counts: dict[int, int] = {}

    def change(call: int, k: int, raw: bytes) -> bytes:
        if not is_data(raw):
            return raw
        n = counts.get(call, 0)
        counts[call] = n + 1
        return change_at(call, n, raw)

    return change


def test_a_flipped_bit_is_caught_at_its_message_and_asked_for_again(server_target, relay, tmp_path, expected, caplog):
    """One bit flipped in the third data message of the first call: the client catches it at that
    message, asks again from the byte before it, and writes exactly the embedded run's files."""
    target, handler = relay(server_target, _data_messages(lambda call, n, raw: flip_bit(raw) if (call, n) == (0, 2) else raw))
    with caplog.at_level(logging.WARNING, logger="modelinit.client"), modelinit.Client(target) as c:
        c.init_model(SPEC, out_dir=tmp_path / "model", parallel=1, **RUN)
    assert read_folder(tmp_path / "model") == expected
    assert handler.init_calls == 2  # the stream, then the one that asked again
    said = [r.getMessage() for r in caplog.records if "CRC32C" in r.getMessage()]
    assert len(said) == 1 and "failed its CRC32C" in said[0] and "asking for it again" in said[0], said


def test_corruption_that_repeats_ends_in_one_clear_error(server_target, relay, tmp_path):
    """The same message corrupted on every try: after three, one DATA_LOSS naming the file and
    the byte, and no finished folder."""
    target, handler = relay(server_target, _data_messages(lambda call, n, raw: flip_bit(raw) if n == 0 else raw))
    with modelinit.Client(target) as c, pytest.raises(ModelInitError) as raised:
        c.init_model(SPEC, out_dir=tmp_path / "model", parallel=1, **RUN)
    err = raised.value
    assert err.code.name == "DATA_LOSS"
    assert "model-00001-of-" in err.details and "failed its CRC32C" in err.details and "3 times in a row" in err.details
    assert handler.init_calls == 3
    assert not (tmp_path / "model" / "modelinit.json").exists()
    assert not list((tmp_path / "model").glob("*.safetensors"))


def test_a_server_without_the_check_is_hashed_here_and_said_once(server_target, relay, tmp_path, expected, caplog,
                                                                 monkeypatch):
    """Data messages without a CRC (a server older than the field): the client hashes every byte
    itself, as before, says so once, and writes the same files."""
    counted = _count_sha256(monkeypatch)
    target, _ = relay(server_target, lambda call, k, raw: without_crc(raw))
    with caplog.at_level(logging.WARNING, logger="modelinit.client"), modelinit.Client(target) as c:
        c.init_model(SPEC, out_dir=tmp_path / "model", **RUN)
    assert read_folder(tmp_path / "model") == expected
    said = [r.getMessage() for r in caplog.records if "sends no CRC32C" in r.getMessage()]
    assert len(said) == 1, said
    assert counted["client"] == sum(len(b) for n, b in expected.items() if n != "modelinit.json")


def _count_sha256(monkeypatch, inputs: list[bytearray] | None = None) -> dict[str, int]:
    """Bytes SHA-256'd by the client's stream check, and by the server's file producer; with
    ``inputs``, what each of the server's hashes was given is appended there too."""
    from modelinit import stream
    from modelinit_server.produce import file_bytes

    counted = {"client": 0, "server": 0}

    class Module:
        def __init__(self, side: str) -> None:
            self.side = side

        def sha256(self, *args):
            h = hashlib.sha256(*args)
            side = self.side
            given = bytearray()
            if inputs is not None and side == "server":
                inputs.append(given)

            class Counting:
                def update(self, data) -> None:
                    counted[side] += memoryview(data).nbytes
                    if inputs is not None:
                        given.extend(data)
                    h.update(data)

                def hexdigest(self) -> str:
                    return h.hexdigest()

                def digest(self) -> bytes:
                    return h.digest()

            return Counting()

    monkeypatch.setattr(stream, "hashlib", Module("client"))
    monkeypatch.setattr(file_bytes, "hashlib", Module("server"))
    return counted


def _count_crc32c(monkeypatch) -> dict[str, int]:
    """Bytes CRC32C'd by the client's stream and by the server's sender."""
    import crc32c as library
    from modelinit.sources import remote
    from modelinit_server.service import servicer

    counted = {"client": 0, "server": 0}

    def counting(side: str):
        class Module:
            @staticmethod
            def crc32c(data, value=0):
                counted[side] += memoryview(data).nbytes
                return library.crc32c(data, value)

        return Module()

    monkeypatch.setattr(remote, "crc32c", counting("client"))
    monkeypatch.setattr(servicer, "crc32c", counting("server"))
    return counted


@pytest.fixture()
def fresh_server(background_server):
    """The target of a server of this test's own: it has hashed nothing yet."""
    return background_server().target


@pytest.mark.parametrize("rehash", [False, True], ids=["default", "rehash"])
def test_each_byte_is_hashed_once_by_the_server_and_crc_checked_on_both_ends(fresh_server, tmp_path, expected,
                                                                            monkeypatch, rehash):
    """Served: every byte SHA-256'd once in all (by the server, whose digest the manifest records),
    and CRC32C'd once on each end; ``rehash`` adds the client's own SHA-256 pass."""
    hashed, crcs = _count_sha256(monkeypatch), _count_crc32c(monkeypatch)
    with modelinit.Client(fresh_server, rehash=rehash) as c:
        c.init_model(SPEC, out_dir=tmp_path / "model", **RUN)
    got = read_folder(tmp_path / "model")
    assert got == expected
    total = sum(len(b) for n, b in got.items() if n != "modelinit.json")
    assert hashed == {"client": total if rehash else 0, "server": total}
    assert crcs == {"client": total, "server": total}


def test_a_server_hashes_a_shard_once_whatever_asks_for_it_again(fresh_server, tmp_path, expected, monkeypatch):
    """A second run of the same model on the same server: the server remembers each shard's
    digest (modelinit_server.produce.digests) and hashes only the small JSON files; the files and
    the manifest are the first run's, byte for byte; ``--rehash`` still hashes everything here."""
    with modelinit.Client(fresh_server) as c:
        c.init_model(SPEC, out_dir=tmp_path / "first", **RUN)
    hashed = _count_sha256(monkeypatch)
    with modelinit.Client(fresh_server) as c:
        c.init_model(SPEC, out_dir=tmp_path / "second", **RUN)
    got = read_folder(tmp_path / "second")
    assert got == read_folder(tmp_path / "first") == expected
    json_files = sum(len(b) for n, b in got.items() if n.endswith(".json") and n != "modelinit.json")
    assert hashed == {"client": 0, "server": json_files}
    with modelinit.Client(fresh_server, rehash=True) as c:
        c.init_model(SPEC, out_dir=tmp_path / "rehashed", **RUN)
    assert read_folder(tmp_path / "rehashed") == expected
    assert hashed["client"] == sum(len(b) for n, b in got.items() if n != "modelinit.json")


def test_a_stream_resumed_inside_a_known_shard_hashes_nothing_again(fresh_server, relay, tmp_path, expected,
                                                                   monkeypatch, caplog):
    """A flipped bit makes the client ask again from inside a shard the server produced whole
    before: the server takes the digest it remembers instead of regenerating the bytes before the
    offset to hash them (only the small JSON files are hashed), and the files are the embedded run's."""
    from modelinit.sources import remote

    with modelinit.Client(fresh_server) as c:
        c.init_model(SPEC, out_dir=tmp_path / "first", **RUN)
    inputs: list[bytearray] = []
    hashed = _count_sha256(monkeypatch, inputs)
    monkeypatch.setattr(remote, "MAX_CHUNK", 4096)  # several data messages per shard: the third is inside the first
    target, handler = relay(fresh_server, _data_messages(lambda call, n, raw: flip_bit(raw) if (call, n) == (0, 2) else raw))
    with caplog.at_level(logging.WARNING, logger="modelinit.client"), modelinit.Client(target) as c:
        c.init_model(SPEC, out_dir=tmp_path / "model", parallel=1, **RUN)
    got = read_folder(tmp_path / "model")
    assert got == expected and handler.init_calls == 2
    assert any("after byte 8192 failed its CRC32C" in r.getMessage() for r in caplog.records)  # resumed at byte 8192
    assert hashed["client"] == 0
    # The server hashed the JSON files and not one byte of a shard. Counted per file, not in bytes:
    # how far the first, cut call ran ahead of the client (flow control, the machine's load) decides
    # whether it began a JSON file too before the client asked again; the second call hashes each.
    json_files = {bytes(b) for n, b in got.items() if n.endswith(".json") and n != "modelinit.json"}
    assert all(any(f.startswith(given) for f in json_files) for given in inputs), [len(g) for g in inputs]
    assert json_files <= {bytes(given) for given in inputs}


@pytest.mark.parametrize("cores, streams", [(2, 1), (7, 1), (8, 2), (16, 4)])
def test_files_in_flight_by_default_follow_the_clients_cores(server_target, relay, tmp_path, expected, monkeypatch,
                                                            cores, streams):
    """``--server`` without ``--parallel``: a quarter of the client's usable cores, at least 1, files
    at once (one stream of all files, or a stream per file); the same bytes."""
    from modelinit.sources import remote

    monkeypatch.setattr(remote, "usable_cores", lambda: cores)
    assert remote.RemoteSource.files_at_once() == streams
    target, handler = relay(server_target, lambda call, k, raw: raw)
    with modelinit.Client(target) as c:
        c.init_model(SPEC, out_dir=tmp_path / "model", **RUN)
    assert read_folder(tmp_path / "model") == expected
    files = len([n for n in expected if n != "modelinit.json"])
    assert handler.init_calls == (1 if streams == 1 else files)


def test_tensors_a_flipped_bit_is_asked_for_again_and_repeated_corruption_ends(server_target, relay):
    """The Tensors stream carries the same check: a bit flipped in one data message is caught at
    it and that selection resumed from the byte before it (the arrays equal the embedded ones);
    the same message corrupted on every try ends in one DATA_LOSS."""
    names = ["transformer.wte.weight", "transformer.h.0.attn.c_attn.weight"]
    with modelinit.Client() as c:
        want = c.tensors(SPEC, seed=4, names=names, as_="bytes")
    target, handler = relay(server_target, _data_messages(lambda call, n, raw: flip_bit(raw) if (call, n) == (0, 1) else raw),
                            "Tensors")
    with modelinit.Client(target) as c:
        got = c.tensors(SPEC, seed=4, names=names, as_="bytes")
    assert {n: bytes(t.data) for n, t in got.items()} == {n: bytes(t.data) for n, t in want.items()}
    assert handler.init_calls == 2
    target, handler = relay(server_target, _data_messages(lambda call, n, raw: flip_bit(raw) if n == 0 else raw), "Tensors")
    with modelinit.Client(target) as c, pytest.raises(ModelInitError) as raised:
        c.tensors(SPEC, seed=4, names=names, as_="bytes")
    assert raised.value.code.name == "DATA_LOSS" and "transformer.wte.weight" in raised.value.details
    assert "3 times in a row" in raised.value.details and handler.init_calls == 3
