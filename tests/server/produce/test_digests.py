"""The producer's memo of shard digests: a shard produced whole once is never hashed again, and a
resumed stream of a known shard generates nothing before its offset."""
import hashlib

import modelinit.client as mc
import pytest
from modelinit_server.core.planner import build_plan
from modelinit_server.engine.backends import REFERENCE
from modelinit_server.messages import request_from_pb
from modelinit_server.produce import digests as memo
from modelinit_server.produce import file_bytes as files

from tests.support import TINY
from tests.support.file_events import collect


def _plan(**kw):
    run = {"seed": 3, "dtype": "bfloat16", "max_shard_size": "300KB", **kw}
    return build_plan(request_from_pb(mc.model_request(TINY["gpt2"], **run)))


@pytest.fixture(scope="module")
def plan():
    return _plan()


class Counting:
    """``hashlib`` for the producer, counting the bytes it SHA-256s."""

    def __init__(self) -> None:
        self.hashed = 0

    def sha256(self):
        h, counting = hashlib.sha256(), self

        class Hasher:
            def update(self, data) -> None:
                counting.hashed += memoryview(data).nbytes
                h.update(data)

            def hexdigest(self) -> str:
                return h.hexdigest()

        return Hasher()


def _counting_fill(counted: list[int]):
    def fill(out, sampler, key, start, count, dtype):
        counted[0] += out.nbytes
        REFERENCE.fill(out, sampler, key, start, count, dtype)

    return fill


def test_a_shard_hashed_whole_is_not_hashed_again_and_ends_with_the_same_digest(plan, monkeypatch):
    counting = Counting()
    monkeypatch.setattr(files, "hashlib", counting)
    known = memo.Digests()
    every = range(len(plan.files))
    first = collect(files.events(plan, every, 0, REFERENCE.fill, segment=4096, ring=3, digests=known))
    shards = [i for i, f in enumerate(plan.files) if f.shard]
    assert len(shards) > 1 and len(known) == len(shards)
    assert counting.hashed == sum(f.size for f in plan.files)  # every byte once, JSON files included
    counting.hashed = 0
    second = collect(files.events(plan, every, 0, REFERENCE.fill, segment=4096, ring=3, digests=known))
    assert second == first
    assert counting.hashed == sum(f.size for f in plan.files if not f.shard)  # only the small JSON files
    assert first[1] == {i: hashlib.sha256(b).hexdigest() for i, b in first[0].items()}


@pytest.mark.parametrize("offset", [1, 4095, 12347])
def test_a_known_shard_resumed_generates_nothing_before_its_offset(plan, offset):
    known = memo.Digests()
    whole, ends = collect(files.events(plan, [0], 0, REFERENCE.fill, segment=4096, digests=known))
    generated = [0]
    data, resumed = collect(files.events(plan, [0], offset, _counting_fill(generated), segment=4096, digests=known))
    assert data[0] == whole[0][offset:] and resumed == ends
    f, itemsize = plan.files[0], 2  # bfloat16: an offset inside an element generates that whole element
    start = max(offset, len(f.header))  # the header is copied, not generated
    assert generated[0] == f.size - start + (start - len(f.header)) % itemsize
    unknown = [0]
    collect(files.events(plan, [0], offset, _counting_fill(unknown), segment=4096, digests=memo.Digests()))
    assert unknown[0] == f.size - len(f.header)  # the prefix regenerated for the hash


def test_a_stream_closed_mid_shard_remembers_nothing(plan):
    known = memo.Digests()
    source = files.events(plan, [0], 0, REFERENCE.fill, segment=4096, digests=known)
    for _ in zip(range(3), source):
        pass
    source.close()
    assert len(known) == 0


def test_the_key_is_the_fingerprint_the_algorithm_and_the_header():
    """Another seed (fingerprint), another layout (header) or another algorithm version: another
    key. A request differing only where shards' bytes do not (the config) shares them."""
    base = _plan()
    key = lambda p, i=0: memo.Digests.key(p.fingerprint, p.algorithm_version, p.files[i].header)  # noqa: E731
    assert key(_plan(seed=4)) != key(base)
    assert key(_plan(max_shard_size="200KB")) != key(base)
    assert memo.Digests.key(base.fingerprint, base.algorithm_version + 1, base.files[0].header) != key(base)
    assert memo.Digests.key(base.fingerprint, base.algorithm_version, base.files[0].header + b" ") != key(base)
    assert key(_plan()) == key(base)


def test_the_memo_is_bounded_least_recently_used_first():
    known = memo.Digests(capacity=2)
    known.put(b"a", "1")
    known.put(b"b", "2")
    assert known.get(b"a") == "1"  # a used: b is the least recent
    known.put(b"c", "3")
    assert (known.get(b"a"), known.get(b"b"), known.get(b"c"), len(known)) == ("1", None, "3", 2)
    with pytest.raises(ValueError, match="capacity"):
        memo.Digests(capacity=0)
