"""Shard packing, size parsing and canonical safetensors headers."""
import json
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from modelinit_server.core import layout
from safetensors.numpy import load


@pytest.mark.parametrize("text, size", [
    ("", 5 * 10**9), ("5GB", 5 * 10**9), ("500MB", 5 * 10**8), ("1GiB", 2**30), ("64KiB", 65536),
    ("4096", 4096), ("10 kb", 10_000), ("1.5GB", 1_500_000_000), ("7B", 7),
])
def test_parse_size(text, size):
    assert layout.parse_size(text) == size


@pytest.mark.parametrize("text", ["0", "0GB", "-1", "-1GB", "lots", "5XB", "1e9", "GB", "5 G B", "99999999999999TB"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="max_shard_size"):
        layout.parse_size(text)


@given(st.text(max_size=20))
def test_parse_size_never_crashes(text):
    try:
        assert layout.parse_size(text) > 0
    except ValueError as e:
        assert str(e).startswith("max_shard_size:")


@given(st.lists(st.integers(1, 1000), min_size=1, max_size=50), st.integers(1, 3000))
def test_pack_shards_greedy_in_order(sizes, limit):
    shards = layout.pack_shards(sizes, limit)
    assert [i for s in shards for i in s] == list(range(len(sizes)))
    for k, s in enumerate(shards):
        total = sum(sizes[i] for i in s)
        assert total <= limit or len(s) == 1
        if k + 1 < len(shards):  # greedy: the next tensor did not fit
            assert total + sizes[shards[k + 1][0]] > limit


def test_pack_shards_fills_a_shard_exactly_to_the_limit():
    """A shard may hold exactly max_shard_size bytes (HF's rule: a tensor opens a new shard only
    when it would overflow): pins the boundary, `>` not `>=`."""
    assert layout.pack_shards([600, 400, 1], 1000) == [[0, 1], [2]]
    assert layout.pack_shards([1000, 1000], 1000) == [[0], [1]]
    assert layout.pack_shards([999, 1, 1], 1000) == [[0, 1], [2]]
    assert layout.pack_shards([1001, 1], 1000) == [[0], [1]]


def test_shard_names():
    assert layout.shard_name(0, 1) == "model.safetensors"
    assert layout.shard_name(1, 3) == "model-00002-of-00003.safetensors"


def test_header_is_canonical_and_loadable():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones(5, dtype=np.float16)
    header = layout.safetensors_header([("a", "float32", (2, 3), 24), ("b", "float16", (5,), 10)], {"format": "pt"})
    n = struct.unpack("<Q", header[:8])[0]
    assert len(header) == 8 + n and n % 8 == 0
    doc = json.loads(header[8:])
    assert list(doc) == ["__metadata__", "a", "b"]
    assert doc["b"] == {"dtype": "F16", "shape": [5], "data_offsets": [24, 34]}
    loaded = load(header + a.tobytes() + b.tobytes())
    assert np.array_equal(loaded["a"], a) and np.array_equal(loaded["b"], b)
