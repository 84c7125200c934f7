"""Golden vectors: they freeze algorithm versions 1 and 2 forever.

The tables (``GOLDEN``, ``GOLDEN_V2``, ``PLAN_PINS``) are in tests/support/golden.py, with the rule
that they are NEVER edited to make a test pass; here the numpy reference engine is checked against
them, along with the v2 keys, the first values as bit patterns and the frozen float64 constants.
"""
from __future__ import annotations

import hashlib

import pytest
from modelinit_server.engine import (
    ALGORITHM_VERSION,
    ALGORITHM_VERSIONS,
    Sampler,
    canonical_name,
    generate,
    generate_array,
    tensor_key,
)

from tests.support.golden import GOLDEN, GOLDEN_V2, PLAN_PINS

def test_algorithm_version():
    assert ALGORITHM_VERSIONS == (1, 2)  # GOLDEN is version 1's table, GOLDEN_V2 version 2's
    assert ALGORITHM_VERSION == 2  # the newest


@pytest.mark.parametrize("case", GOLDEN, ids=[c[0] for c in GOLDEN])
def test_golden_sha256(case):
    _, seed, name, kwargs, dtype, start, count, digest = case
    data = generate(Sampler(**kwargs), tensor_key(seed, name, 1), start, count, dtype)
    assert hashlib.sha256(data).hexdigest() == digest


@pytest.mark.parametrize("case", GOLDEN_V2, ids=[c[0] for c in GOLDEN_V2])
def test_golden_v2_sha256(case):
    _, seed, name, prefix, kwargs, dtype, start, count, digest = case
    data = generate(Sampler(**kwargs), tensor_key(seed, canonical_name(name, prefix), 2), start, count, dtype)
    assert hashlib.sha256(data).hexdigest() == digest


def test_v2_keys_pinned():
    """The v2 key: SHA-256 over b"modelinit-v2\\x00" + seed (8 bytes LE) + canonical name (UTF-8)."""
    assert tensor_key(0, "w", 2) == (0x914348E0, 0xAF4BBCFA)
    assert tensor_key(2**64 - 1, "embed_tokens.weight", 2) == (0xCA3F5591, 0x61B79342)
    assert tensor_key(0, "encoder.layer.0.attention.self.query.weight", 2) == (0xA939B4AA, 0xE3BA25D5)
    first = generate_array(Sampler("normal", std=0.02), tensor_key(0, "encoder.layer.0.attention.self.query.weight", 2),
                           0, 8, "bfloat16")
    assert [int(v) for v in first] == [0xBBDD, 0xBC13, 0xBC95, 0x3C81, 0xBBBB, 0x3C94, 0xBC3F, 0x3C5D]


@pytest.mark.parametrize("pin", sorted(PLAN_PINS), ids=lambda p: f"v{p[0]}-{p[1]}-{p[2]}")
def test_plan_pins(pin):
    """A whole request of each version still gives the pinned fingerprint and file bytes."""
    import modelinit.client as mc
    from modelinit_server.core.planner import build_plan
    from modelinit_server.messages import request_from_pb
    from modelinit_server.produce import file_bytes as files

    from tests.support import TINY

    version, family, dtype = pin
    request = mc.model_request(TINY[family], seed=3, dtype=dtype, max_shard_size="300KB", algorithm_version=version)
    plan = build_plan(request_from_pb(request))
    assert plan.algorithm_version == version
    fingerprint, shas = PLAN_PINS[pin]
    assert plan.fingerprint == fingerprint
    assert [hashlib.sha256(files.read(plan, f, 0, f.size)).hexdigest() for f in plan.files if f.shard] == shas


def test_golden_first_values():
    """The first values of three cases as bit patterns, for debugging a kernel element by element."""
    bf16 = generate_array(
        Sampler("normal", std=0.02), tensor_key(0, "model.layers.0.self_attn.q_proj.weight", 1), 0, 8, "bfloat16"
    )
    assert [int(v) for v in bf16] == [0x3C14, 0x3C88, 0xBA22, 0x3CD4, 0x3BB0, 0xBA5B, 0x3BE9, 0x3CAA]
    f32 = generate_array(Sampler("normal", mean=0.1, std=1.5), tensor_key(1, "h.0.mlp.c_fc.weight", 1), 3, 6, "float32")
    assert [int(v) for v in f32.view("<u4")] == [
        0xBF066D00, 0x3F1A30FF, 0x400B205D, 0x3F12EA3E, 0xBCF546D3, 0xBF68A133,
    ]  # -0.5251007, 0.6023101, 2.1738503, 0.57388675, -0.029941, -0.9087097
    tail = generate_array(Sampler("trunc_normal", std=1.0, b=-6.0), tensor_key(9, "t.low", 1), 5, 4, "float32")
    assert [int(v) for v in tail.view("<u4")] == [0xC0C6900C, 0xC0C91315, 0xC0C6111F, 0xC0C21B7C]
    # -6.205084, -6.2835793, -6.18959, -6.065855


def test_constants_frozen():
    """Every float64 constant that determines bytes, hashed as little-endian binary64 (version 1)."""
    import struct

    from modelinit_server.engine import special as sp

    vals = [*sp.AS241_A, *sp.AS241_B, *sp.AS241_C, *sp.AS241_D, *sp.AS241_E, *sp.AS241_F]
    vals += [*sp.LOG_C[1:], sp.LN2_HI, sp.LN2_LO, sp.SQRT_HALF]
    blob = struct.pack(f"<{len(vals)}d", *vals)
    assert hashlib.sha256(blob).hexdigest() == "431aa1d2ef74ee95f208092d2459bbf07e51fb18d3c5274aee1884da5c6944a3"


def test_spec_tables_match_code():
    """docs/determinism.md lists the coefficients as bit patterns; they must be the ones the code uses."""
    import re
    import struct

    from modelinit_server.engine import special as sp

    from tests.support import REPO

    doc = REPO / "docs" / "determinism.md"
    if not doc.exists():
        pytest.skip("docs/determinism.md not found")
    rows = dict(re.findall(r"^\| (\w+) \| .*\| `(0x[0-9A-F]{16})` \|$", doc.read_text(), re.M))
    bits = lambda x: "0x%016X" % struct.unpack("<Q", struct.pack("<d", x))[0]  # noqa: E731
    expected = {}
    for letter, coefs in zip("abcdef", (sp.AS241_A, sp.AS241_B, sp.AS241_C, sp.AS241_D, sp.AS241_E, sp.AS241_F)):
        for k, c in enumerate(coefs):
            expected[f"{letter}{7 - k}"] = bits(c)
    for k in range(1, 11):
        expected[f"C{k}"] = bits(sp.LOG_C[k])
    expected.update(SQRT_HALF=bits(sp.SQRT_HALF), LN2_HI=bits(sp.LN2_HI), LN2_LO=bits(sp.LN2_LO))
    assert rows == expected
