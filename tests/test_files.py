"""The file producer: segments, resume offsets, buffer reuse and the prefetch thread."""
import hashlib

import modelinit.client as mc
import pytest
from modelinit_server.core.planner import build_plan
from modelinit_server.engine.backends import REFERENCE
from modelinit_server.messages import request_from_pb
from modelinit_server.produce import file_bytes as files
from modelinit_wire.events import Begin, Data, End

from tests.conftest import TINY


@pytest.fixture(scope="module")
def plan():
    return build_plan(request_from_pb(mc.model_request(TINY["gpt2"], seed=3, dtype="bfloat16", max_shard_size="300KB")))


def collect(source) -> tuple[dict[int, bytes], dict[int, str | None]]:
    data, ends, cur = {}, {}, None
    for ev in source:
        if isinstance(ev, Begin):
            cur = ev.index
            data[cur] = b""
        elif isinstance(ev, Data):
            data[cur] += bytes(ev.data)  # copy now: with a ring the buffer is reused later
        else:
            assert isinstance(ev, End)
            ends[ev.index] = ev.sha256
    return data, ends


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
