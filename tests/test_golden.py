"""Golden vectors: they freeze algorithm version 1 forever.

Every SHA-256 below was computed once by the numpy reference engine after it passed all other tests.
They must NEVER be edited to make a test pass: a mismatch means the bytes of version 1 changed,
which breaks every checkpoint anyone has generated. A deliberate change of the algorithm needs a new
ALGORITHM_VERSION (and a new table next to this one), never an edit of this one. The later CPU
(numba) and GPU (Triton) kernels must reproduce these exact bytes too.
"""
from __future__ import annotations

import hashlib

import pytest

from modelinit_server.engine import ALGORITHM_VERSION, Sampler, generate, generate_array, tensor_key


# (id, seed, tensor name, Sampler kwargs, dtype, start, count, sha256 of generate(...) bytes)
GOLDEN = [
    ("normal-bf16", 0, "model.layers.0.self_attn.q_proj.weight", dict(kind="normal", std=0.02),
     "bfloat16", 0, 1000, "228401da1dccb883106899b64fc8ffea3abea53e8f9b25baf5c9ce3cfb1c435d"),
    ("normal-f32-unaligned", 1, "h.0.mlp.c_fc.weight", dict(kind="normal", mean=0.1, std=1.5),
     "float32", 3, 777, "266deb2434b6f059d62fb49a34816b35be53c70c1b370583014bad7168ba8bea"),
    ("normal-f16-offset", 42, "encoder.layer.3.output.dense.weight", dict(kind="normal", std=0.02),
     "float16", 1_000_001, 513, "2d99af728fd8d8df1512c06c0d01bcb3439b5f0f68556acc9afbdc8b65b590b4"),
    ("trunc-bf16", 7, "blocks.0.attn.qkv.weight", dict(kind="trunc_normal", std=0.02, a=-2.0, b=2.0),
     "bfloat16", 0, 4099, "b135d64bf2cc13d6aa399bf746e32b449acc96f7442db27f5b49b3c7ab4fd158"),
    ("trunc-asym-f32", 7, "blocks.0.attn.proj.weight", dict(kind="trunc_normal", mean=0.5, std=3.0, a=-0.5, b=3.0),
     "float32", 2, 1001, "cb55806e63b663764eac58fe1e7f0ff3232ed1119bca5ec20d8e0938f87d44f6"),
    ("trunc-lowtail-f32", 9, "t.low", dict(kind="trunc_normal", std=1.0, b=-6.0),
     "float32", 5, 300, "031c674deb5fa9a83f9c76d0387b655f9d29b119bbd34f23ca782cd28ec799cb"),
    ("trunc-uptail-f16", 9, "t.up", dict(kind="trunc_normal", std=1.0, a=5.0),
     "float16", 0, 256, "b59d4c40914664be702f9b6fe089816fa48632b63d25bd89f62fdb98c6cb3dd7"),
    ("uniform-bf16", 3, "lm_head.weight", dict(kind="uniform", low=-0.05, high=0.05),
     "bfloat16", 7, 999, "2d0067142def95a48cae8baec5f2b7b5c28f77771e261ab6c0d384cac6ced8af"),
    ("uniform-f32-far", 3, "big", dict(kind="uniform", low=0.0, high=1.0),
     "float32", 2**34 + 1, 64, "271b1d12301f2149692484e0631aa083bc4451cf261007cccb33835864884970"),
    ("constant-f16", 0, "model.norm.weight", dict(kind="constant", value=1.0),
     "float16", 0, 10, "34b31038c972d668d743270a3383094f93997ee2004d1c861a1b563e9cbb9d2e"),
    ("constant-third-f32-pad", 5, "c", dict(kind="constant", value=1.0 / 3.0, zero_row=0, row_size=3),
     "float32", 1, 7, "4cce5c37f43ff704b02d2b18c2ee6eafd693faeaa1dd20a6fcbbe0d6ae8293b0"),
    ("padding-row-bf16", 11, "transformer.wte.weight", dict(kind="normal", std=0.02, zero_row=1, row_size=64),
     "bfloat16", 32, 128, "ccfa3c166a4bc14267a7d01b897d72fda3f589a7d6f0d9cfa912c5041177ecc3"),
    ("max-seed-unicode", 2**64 - 1, "ünïcødé.weight", dict(kind="normal", mean=-1.0, std=0.5),
     "float32", 1, 33, "71c8b7269f00c9828924b830cbff23e19f7dbea03c7fa5143c41ccf61ce9b8bd"),
]


def test_algorithm_version():
    assert ALGORITHM_VERSION == 1  # this table is version 1's


@pytest.mark.parametrize("case", GOLDEN, ids=[c[0] for c in GOLDEN])
def test_golden_sha256(case):
    _, seed, name, kwargs, dtype, start, count, digest = case
    data = generate(Sampler(**kwargs), tensor_key(seed, name), start, count, dtype)
    assert hashlib.sha256(data).hexdigest() == digest


def test_golden_first_values():
    """The first values of three cases as bit patterns, for debugging a kernel element by element."""
    bf16 = generate_array(
        Sampler("normal", std=0.02), tensor_key(0, "model.layers.0.self_attn.q_proj.weight"), 0, 8, "bfloat16"
    )
    assert [int(v) for v in bf16] == [0x3C14, 0x3C88, 0xBA22, 0x3CD4, 0x3BB0, 0xBA5B, 0x3BE9, 0x3CAA]
    f32 = generate_array(Sampler("normal", mean=0.1, std=1.5), tensor_key(1, "h.0.mlp.c_fc.weight"), 3, 6, "float32")
    assert [int(v) for v in f32.view("<u4")] == [
        0xBF066D00, 0x3F1A30FF, 0x400B205D, 0x3F12EA3E, 0xBCF546D3, 0xBF68A133,
    ]  # -0.5251007, 0.6023101, 2.1738503, 0.57388675, -0.029941, -0.9087097
    tail = generate_array(Sampler("trunc_normal", std=1.0, b=-6.0), tensor_key(9, "t.low"), 5, 4, "float32")
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
    import pathlib
    import re
    import struct

    from modelinit_server.engine import special as sp

    doc = pathlib.Path(__file__).resolve().parents[1] / "docs" / "determinism.md"
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
