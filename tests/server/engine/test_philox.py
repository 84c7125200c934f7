"""Philox4x32-10 known answers, the counter/lane mapping, and the per-tensor key (algorithm versions 1 and 2)."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
from modelinit_server.engine import canonical_name, philox4x32_10, tensor_key
from modelinit_server.engine.philox import random_bits

M32 = 0xFFFFFFFF

# Random123 known-answer tests (kat_vectors, philox4x32_10): (counter, key, output).
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((M32, M32, M32, M32), (M32, M32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


def philox_scalar(ctr: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, int, int, int]:
    """Plain-integer Philox4x32-10, written straight from the paper, as an independent reference."""
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for _ in range(10):
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & M32, (p0 >> 32) ^ c3 ^ k1, p0 & M32
        k0 = (k0 + 0x9E3779B9) & M32
        k1 = (k1 + 0xBB67AE85) & M32
    return c0, c1, c2, c3


@pytest.mark.parametrize("ctr,key,expected", KAT)
def test_random123_known_answers(ctr, key, expected):
    out = philox4x32_10(np.array([ctr], dtype=np.uint32), key)
    assert out.dtype == np.uint32 and out.shape == (1, 4)
    assert tuple(int(w) for w in out[0]) == expected
    assert philox_scalar(ctr, key) == expected


def test_vectorized_matches_scalar_reference():
    rng = np.random.default_rng(123)
    ctrs = rng.integers(0, 2**32, size=(300, 4), dtype=np.uint64)
    for key in [(0, 0), (M32, 1), (0x12345678, 0x9ABCDEF0)]:
        out = philox4x32_10(ctrs, key)
        for row, o in zip(ctrs, out):
            assert tuple(int(w) for w in o) == philox_scalar(tuple(int(c) for c in row), key)


def test_rows_are_independent_of_batch():
    ctrs = np.array([k for k, _, _ in KAT], dtype=np.uint32)
    key = (0xA4093822, 0x299F31D0)
    together = philox4x32_10(ctrs, key)
    for i in range(len(ctrs)):
        assert np.array_equal(together[i], philox4x32_10(ctrs[i : i + 1], key)[0])
    assert philox4x32_10(np.zeros((0, 4), dtype=np.uint32), key).shape == (0, 4)


@pytest.mark.parametrize(
    "start,count",
    [(0, 16), (1, 9), (2, 1), (3, 5), (7, 13), (4 * 2**32 - 6, 12), (2**40 + 3, 10), (5 * 2**34 + 1, 7)],
)
def test_lane_counter_mapping(start, count):
    """Element i uses counter c = i // 4 as (c & 0xffffffff, c >> 32, 0, 0) and takes output word i % 4."""
    key = (0x01234567, 0x89ABCDEF)
    bits = random_bits(key, start, count)
    assert bits.shape == (count,)
    for j, i in enumerate(range(start, start + count)):
        c = i // 4
        assert int(bits[j]) == philox_scalar((c & M32, c >> 32, 0, 0), key)[i % 4]


def test_random_bits_empty():
    assert random_bits((1, 2), 17, 0).shape == (0,)


def test_bad_inputs():
    with pytest.raises(ValueError, match="^key: "):
        philox4x32_10(np.zeros((1, 4), dtype=np.uint32), (2**32, 0))
    with pytest.raises(ValueError, match="^key: "):
        philox4x32_10(np.zeros((1, 4), dtype=np.uint32), (1, 2, 3))
    with pytest.raises(ValueError, match="^counters: "):
        philox4x32_10(np.zeros((1, 3), dtype=np.uint32), (0, 0))
    with pytest.raises(ValueError, match="^counters: "):
        philox4x32_10(np.array([[0, 0, 0, 2**32]], dtype=np.uint64), (0, 0))


def test_tensor_key_definition():
    for seed, name in [(0, "w"), (2**64 - 1, "model.layers.0.mlp.up_proj.weight"), (42, "é∂"), (7, "")]:
        for version in (1, 2):
            domain = b"modelinit-v%d\x00" % version
            d = hashlib.sha256(domain + seed.to_bytes(8, "little") + name.encode("utf-8")).digest()
            assert tensor_key(seed, name, version) == (int.from_bytes(d[0:4], "little"), int.from_bytes(d[4:8], "little"))
        assert tensor_key(seed, name) == tensor_key(seed, name, 1)  # the low-level default is version 1
        assert tensor_key(seed, name, 2) != tensor_key(seed, name, 1)


@pytest.mark.parametrize("version", [0, 3, -1, True, 1.0, "2", None])
def test_tensor_key_version(version):
    with pytest.raises(ValueError, match="^algorithm_version: "):
        tensor_key(0, "w", version)


def test_canonical_name():
    assert canonical_name("bert.encoder.layer.0.attention.self.query.weight", "bert") == "encoder.layer.0.attention.self.query.weight"
    assert canonical_name("model.layers.0.mlp.up_proj.weight", "model") == "layers.0.mlp.up_proj.weight"
    assert canonical_name("transformer.wte.weight", "transformer") == "wte.weight"
    assert canonical_name("lm_head.weight", "model") == "lm_head.weight"  # heads keep their names
    assert canonical_name("cls.predictions.bias", "bert") == "cls.predictions.bias"
    assert canonical_name("modelx.w", "model") == "modelx.w"  # a whole leading component only
    assert canonical_name("model", "model") == "model"
    assert canonical_name("model.model.w", "model") == "model.w"  # removed once
    assert canonical_name("bert.pooler.dense.weight", "") == "bert.pooler.dense.weight"  # base class: no prefix


def test_tensor_key_pinned():
    # Frozen with algorithm version 1 (never edit to make a test pass).
    assert tensor_key(0, "w") == (0xA10E9255, 0xE51FC303)
    assert tensor_key(2**64 - 1, "model.embed_tokens.weight") == (0x19C4F62B, 0xA694FC5A)
    assert tensor_key(np.uint64(5), "w") == tensor_key(5, "w")


def test_tensor_key_distinct():
    keys = {tensor_key(s, n) for s in range(20) for n in ("a", "b", "a.weight", "a.bias")}
    assert len(keys) == 80


@pytest.mark.parametrize("seed", [-1, 2**64, 1.5, "3", None, True])
def test_tensor_key_seed_range(seed):
    with pytest.raises(ValueError, match="^seed: "):
        tensor_key(seed, "w")


def test_tensor_key_name():
    with pytest.raises(ValueError, match="^name: "):
        tensor_key(0, b"w")
    with pytest.raises(ValueError, match="^name: "):
        tensor_key(0, "\udc80")  # lone surrogate: not UTF-8 encodable
