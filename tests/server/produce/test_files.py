"""The file producer: segments, resume offsets, buffer reuse and the prefetch thread."""
import hashlib

import modelinit.client as mc
import pytest
from modelinit_server.core.planner import build_plan
from modelinit_server.engine.backends import REFERENCE
from modelinit_server.messages import request_from_pb
from modelinit_server.produce import file_bytes as files
from modelinit_wire.events import Begin, End

from tests.support import TINY
from tests.support.file_events import collect


@pytest.fixture(scope="module")
def plan():
    return build_plan(request_from_pb(mc.model_request(TINY["gpt2"], seed=3, dtype="bfloat16", max_shard_size="300KB")))


def test_segments_through_a_buffer_ring_and_prefetch_equal_the_whole_files(plan):
    whole = {i: files.read(plan, f, 0, f.size) for i, f in enumerate(plan.files)}
    assert max(f.size for f in plan.files) > 40 * 4096  # many segments per shard
    source = files.events(plan, range(len(plan.files)), 0, REFERENCE.fill, segment=4096, ring=4)
    prefetched = files.Prefetch(source, depth=2)
    data, ends = collect(prefetched)
    prefetched.close()
    assert data == whole
    assert ends == {i: hashlib.sha256(b).hexdigest() for i, b in whole.items()}


@pytest.mark.parametrize("offset", [0, 1, 4095, 4096, 12347])
def test_resume_offset_sends_the_tail_and_hashes_the_whole(plan, offset):
    f = plan.files[0]
    whole = files.read(plan, f, 0, f.size)
    data, ends = collect(files.events(plan, [0], offset, REFERENCE.fill, segment=4096, ring=3))
    assert data[0] == whole[offset:]
    assert ends[0] == hashlib.sha256(whole).hexdigest()
    data, ends = collect(files.events(plan, [0], offset, REFERENCE.fill, segment=4096, digest=False))
    assert data[0] == whole[offset:] and ends[0] is None


def test_prefetch_hands_errors_to_the_consumer_and_close_stops_the_producer():
    def broken():
        yield 1
        raise ValueError("boom")

    p = files.Prefetch(broken(), depth=1)
    assert next(p) == 1
    with pytest.raises(ValueError, match="boom"):
        next(p)
    endless = files.Prefetch(iter(int, 1), depth=1)  # never ends; close() must not hang
    next(endless)
    endless.close()


def test_ring_buffers_come_from_the_backends_allocator_and_are_page_aligned(plan):
    import numpy as np

    made = []

    def alloc(n):  # stands in for the CUDA backend's pinned allocator
        buf = files._page_aligned(n)
        made.append(buf)
        return buf

    data, _ = collect(files.events(plan, range(len(plan.files)), 0, REFERENCE.fill, segment=8192, ring=3, alloc=alloc))
    assert len(made) == 3 and all(b.ctypes.data % 4096 == 0 for b in made)
    assert data == {i: files.read(plan, f, 0, f.size) for i, f in enumerate(plan.files)}
    assert files._page_aligned(12345).ctypes.data % 4096 == 0 and files._page_aligned(1).dtype == np.uint8


class _SlowSha:
    """hashlib.sha256 whose updates take a while: the producer's next segment is generated meanwhile."""

    def __init__(self, counts: list[int]):
        self.h, self.counts = hashlib.sha256(), counts

    def update(self, data):
        import time

        time.sleep(0.02)
        self.counts.append(len(memoryview(data).cast("B")))
        self.h.update(data)

    def hexdigest(self):
        return self.h.hexdigest()


def test_the_hash_overlaps_generation_which_leaves_it_a_core(plan, monkeypatch):
    """Each segment is hashed on a helper thread while the next is generated; that generation takes
    ``fill_beside`` (one core fewer) while the hash runs, ``fill`` after, in pieces of at most
    SUBSEGMENT bytes; the bytes and digests are those of one plain pass, and every byte is hashed once."""
    import types

    counts: list[int] = []
    monkeypatch.setattr(files, "hashlib", types.SimpleNamespace(sha256=lambda: _SlowSha(counts)))
    monkeypatch.setattr(files, "SUBSEGMENT", 1024)
    calls = {"fill": [], "beside": []}

    def fill(out, *a):
        calls["fill"].append(len(out))
        REFERENCE.fill(out, *a)

    def beside(out, *a):
        calls["beside"].append(len(out))
        assert a[-1] >= 1  # a core left to each hash in flight (this stream's: one)
        REFERENCE.fill(out, *a[:-1])

    data, ends = collect(files.events(plan, range(len(plan.files)), 0, fill, segment=8192, ring=3, fill_beside=beside))
    whole = {i: files.read(plan, f, 0, f.size) for i, f in enumerate(plan.files)}
    assert data == whole
    assert ends == {i: hashlib.sha256(b).hexdigest() for i, b in whole.items()}
    assert sum(counts) == sum(f.size for f in plan.files)  # hashed once
    assert calls["beside"] and calls["fill"]  # beside a running hash, and alone once it ended
    assert max(calls["beside"]) <= 1024


def test_once_the_hash_ends_the_rest_of_the_range_is_one_fill_on_every_core(plan, monkeypatch):
    """While the hash runs, pieces of SUBSEGMENT bytes leave it a core; once it has ended, the rest
    is one ``fill`` (one launch on every core, not one per piece): the hash's core idles no longer
    than one piece."""
    import numpy as np

    monkeypatch.setattr(files, "SUBSEGMENT", 1024)
    t = next(t for t in plan.tensors if t.spec.numel * 2 > 3 * 1024)
    calls: list[tuple] = []
    running = iter([1, 2, 0])  # hashes in flight, as each piece starts

    def fill(out, *a):
        calls.append(("fill", len(out)))
        REFERENCE.fill(out, *a)

    def beside(out, *a):
        calls.append(("beside", len(out), a[-1]))
        REFERENCE.fill(out, *a[:-1])

    out = np.empty(t.spec.numel * 2, np.uint8)
    files._switching(fill, beside, lambda: next(running))(out, t.sampler, t.key, 0, t.spec.numel, "bfloat16")
    step = files.SUBSEGMENT
    # a core left to each hash in flight, then the rest at once
    assert calls == [("beside", step, 1), ("beside", step, 2), ("fill", len(out) - 2 * step)]
    ref = np.empty_like(out)
    REFERENCE.fill(ref, t.sampler, t.key, 0, t.spec.numel, "bfloat16")
    assert bytes(out) == bytes(ref)


def test_hashes_are_counted_from_submission_across_streams():
    """A generation that starts right after its segment's hash was submitted leaves that hash its core
    although the hash thread has not picked it up yet; every stream's hashes count."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    hashes, gate, seen = files.Hashes(), threading.Event(), []
    with ThreadPoolExecutor(1) as a, ThreadPoolExecutor(1) as b:
        a.submit(gate.wait)  # a's hash thread is busy: the next update waits in its queue
        first = hashes.submit(a, seen.append, 1)
        assert hashes() == 1 and not seen
        second = hashes.submit(b, lambda x: (gate.wait(), seen.append(x)), 2)
        assert hashes() == 2
        gate.set()
        first.result(), second.result()
    assert hashes() == 0 and sorted(seen) == [1, 2]
    with ThreadPoolExecutor(1) as c:
        failing = hashes.submit(c, lambda x: 1 / 0, None)
        with pytest.raises(ZeroDivisionError):
            failing.result()
    assert hashes() == 0


def test_switching_fill_cuts_anywhere_and_keeps_the_bytes(plan):
    import numpy as np

    t = next(t for t in plan.tensors if t.spec.numel > 5000)
    ref = np.empty(t.spec.numel * 2, np.uint8)
    REFERENCE.fill(ref, t.sampler, t.key, 0, t.spec.numel, "bfloat16")
    flips = iter(range(10**6))
    out = np.empty_like(ref)
    files._switching(REFERENCE.fill, lambda *a: REFERENCE.fill(*a[:-1]), lambda: int(next(flips) % 3 == 0))(
        out, t.sampler, t.key, 0, t.spec.numel, "bfloat16")
    assert bytes(out) == bytes(ref)


def test_the_embedded_job_hashes_each_byte_once_in_the_producer(tmp_path, monkeypatch):
    """In-process, the producer's SHA-256 is the file's (the writer hashes nothing), and the
    manifest's digests are the files' own; through a server the writer hashes what arrives."""
    import json
    import types

    from modelinit import stream

    made: dict[str, list[int]] = {"producer": [], "writer": []}

    def counting(where):
        class Counted:
            def __init__(self):
                self.h = hashlib.sha256()

            def update(self, data):
                made[where].append(len(memoryview(data).cast("B")))
                self.h.update(data)

            def hexdigest(self):
                return self.h.hexdigest()

        return types.SimpleNamespace(sha256=Counted)

    monkeypatch.setattr(files, "hashlib", counting("producer"))
    monkeypatch.setattr(stream, "hashlib", counting("writer"))
    with mc.Client(device="reference") as client:
        result = client.init_model(TINY["gpt2"], seed=3, out_dir=tmp_path / "out", dtype="bfloat16", max_shard_size="300KB")
    manifest = json.loads((tmp_path / "out" / "modelinit.json").read_text())
    sizes = {e["name"]: e["size"] for e in manifest["files"]}
    assert sum(made["producer"]) == sum(sizes.values()) and made["writer"] == []
    for e in manifest["files"]:
        assert hashlib.sha256((tmp_path / "out" / e["name"]).read_bytes()).hexdigest() == e["sha256"]
    assert result.files


def test_a_writer_that_trusts_the_producer_needs_its_digest():
    from modelinit.errors import ModelInitError
    from modelinit.stream import StreamCheck

    from modelinit_server.service.embedded import EmbeddedService

    msg = mc.model_request(TINY["gpt2"], seed=3, dtype="bfloat16", max_shard_size="300KB")
    proto = EmbeddedService("reference").plan(msg, 0)
    check = StreamCheck(proto, [0], hashed=False)
    f = proto.files[0]
    check.begin(Begin(0, f.name, f.size, 0))
    check.data(b"\0" * f.size)
    with pytest.raises(ModelInitError, match="sent no SHA-256"):
        check.end(End(0, None))
    check = StreamCheck(proto, [0], hashed=False)
    check.begin(Begin(0, f.name, f.size, 0))
    check.data(b"\0" * f.size)
    assert check.end(End(0, "ab" * 32)).sha256 == "ab" * 32


def test_the_cpu_backend_fills_beside_hashes_with_a_core_fewer_for_each(plan, monkeypatch):
    import numpy as np

    from modelinit_server.engine import cpu
    from modelinit_server.engine.backends import select

    if not cpu.available():
        pytest.skip("numba is not installed")
    backend = select("cpu")
    asked = []
    real = cpu.generate_into
    monkeypatch.setattr(cpu, "generate_into", lambda *a, threads=None: (asked.append(threads), real(*a, threads=threads)))
    t = max(plan.tensors, key=lambda t: t.spec.numel)
    a, b = np.empty(t.nbytes, np.uint8), np.empty(t.nbytes, np.uint8)
    backend.fill(a, t.sampler, t.key, 0, t.spec.numel, "bfloat16")
    for leave in (1, 2):
        b[:] = 0
        backend.fill_beside(b, t.sampler, t.key, 0, t.spec.numel, "bfloat16", leave)
        assert bytes(a) == bytes(b)
        assert asked[-1] == max(1, cpu.threads() - leave)


def test_prefetch_closed_from_another_thread_wakes_its_consumer():
    """A parallel job's first failure closes the other files' streams from the main thread: a writer
    waiting for its next event gets Closed (it used to wait forever), and the source's cleanup runs."""
    import threading
    import time

    cleaned = threading.Event()

    def slow():
        try:
            yield 1
            while True:
                time.sleep(0.3)
                yield 2
        finally:
            cleaned.set()

    p = files.Prefetch(slow(), depth=1)
    assert next(p) == 1
    got = []

    def consume():
        try:
            for _ in p:
                pass
        except files.Closed as e:
            got.append(e)

    t = threading.Thread(target=consume)
    t.start()
    time.sleep(0.2)
    p.close()
    t.join(5)
    assert not t.is_alive() and len(got) == 1
    assert cleaned.wait(5)
