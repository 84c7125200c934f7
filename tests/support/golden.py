"""Golden vectors: they freeze algorithm versions 1 and 2 forever (the tests that check them are
tests/server/engine/test_golden.py, and the kernels' tests run them through the numba and Triton kernels).

Every SHA-256 below was computed once by the numpy reference engine after it passed all other tests.
They must NEVER be edited to make a test pass: a mismatch means the bytes of version 1 changed,
which breaks every checkpoint anyone has generated. A deliberate change of the algorithm needs a new
ALGORITHM_VERSION (and a new table next to this one), never an edit of this one. The later CPU
(numba) and GPU (Triton) kernels must reproduce these exact bytes too.

``GOLDEN`` is version 1's table (keys from full names, ``tensor_key(seed, name, 1)``);
``GOLDEN_V2`` is version 2's (keys from canonical names under the v2 domain). ``PLAN_PINS`` pin
whole requests (fingerprint and every file's SHA-256) of both versions end to end.
"""
from __future__ import annotations

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


# Version 2: (id, seed, full tensor name, base_model_prefix, Sampler kwargs, dtype, start, count, sha256).
# The key is tensor_key(seed, canonical_name(name, prefix), 2). The first two cases are one tensor
# (BertForMaskedLM's and BertModel's query weight): one digest.
GOLDEN_V2 = [
    ("bert-query-bf16", 0, "bert.encoder.layer.0.attention.self.query.weight", "bert", dict(kind="normal", std=0.02),
     "bfloat16", 0, 1000, "f8ddc193f325f5d824a038c1a4d3e8d7659492efbb3427f1e4831871f32d2be7"),
    ("bert-base-query-bf16", 0, "encoder.layer.0.attention.self.query.weight", "", dict(kind="normal", std=0.02),
     "bfloat16", 0, 1000, "f8ddc193f325f5d824a038c1a4d3e8d7659492efbb3427f1e4831871f32d2be7"),
    ("mlm-head-dense-f32", 0, "cls.predictions.transform.dense.weight", "bert",
     dict(kind="trunc_normal", std=0.02, a=-2.0, b=2.0),
     "float32", 3, 777, "845e56eccfaabef328bfdfc5489cbe963641ce6796cd0791cc4a6c23636ead2c"),
    ("llama-embed-f16-offset", 42, "model.embed_tokens.weight", "model", dict(kind="normal", std=0.02, zero_row=1, row_size=64),
     "float16", 1_000_001, 513, "da00de03e1dd56cdd4b62c3878c8a19766f9d7e5af0678dcc22afb9961b182f5"),
    ("lm-head-uniform-bf16", 3, "lm_head.weight", "model", dict(kind="uniform", low=-0.05, high=0.05),
     "bfloat16", 7, 999, "547b6a182a0d180c1a8522e72fe93f99d98870b17c897b06211a37c78e6ad505"),
    ("gpt2-far-f32", 7, "transformer.h.0.attn.c_attn.weight", "transformer",
     dict(kind="trunc_normal", mean=0.5, std=3.0, a=-0.5, b=3.0),
     "float32", 2**34 + 1, 64, "27946152c782fe0f8ccd69ff0b94eac3126ab472475cd65fee1a9ad12fcd9e99"),
    ("prefix-not-component", 9, "modelx.w", "model", dict(kind="trunc_normal", std=1.0, a=5.0),
     "float16", 0, 256, "766ae4464e576bc1d5260d733ae85485d675ace845708e4268b062b28056be3f"),
    ("max-seed-unicode", 2**64 - 1, "ünïcødé.weight", "", dict(kind="normal", mean=-1.0, std=0.5),
     "float32", 1, 33, "570a21d916bf59f3d46ca6721443554af52db5e70ba0f3b6bf351f58271d9abf"),
]

# Whole requests: TINY config, seed 3, max_shard_size "300KB" -> (fingerprint, SHA-256 of every
# safetensors shard in order; the JSON files are not the algorithm's). The version-1 pins were computed with the code from before version 2 existed.
PLAN_PINS = {
    (1, "gpt2", "bfloat16"): ("d149cb5833b9707a633b2be046b2d132a414e5a8d436eebfadfab01e757d78e5", [
        "2195549d8e24f62ed8fe62b5c76a9855e7903144a153248eff7fbc8a2c5f3804",
        "e2cccffce835e3300097ebb1dc3ef5e38e1578a60bfd95c31e9afc15502ead97"]),
    (1, "llama", "float32"): ("f11c9f12da46830d28705e542d9e8668106c1b3ec4ebea9ded34fa21f70358d5", [
        "71b0d76593e249860a991aed22d69848b716d258a704caa30edec8ed8b54980c",
        "483700c53f74fc98acb7be24961ca8b6c699562283666c5e58681247e07072c4",
        "422b5e7a47f35cb4adc0a3b73c39d398ccc81d4bd08dd876e4087841f7e70fe3"]),
    (1, "bert", "float16"): ("fe1770a3b72f880b17d9dd36640b6e7b4a034025256f656f7ad18a250e8ff0b1", [
        "a411b191c7c2952fafe9c4b85245ced02cc0c430931ee77e0841af529b3514cd"]),
    (2, "gpt2", "bfloat16"): ("e292e66e0a81ed99a5c23adbe607cdfc26087ca2a33c29e4750f87edc42e66d6", [
        "f811f138518f608afec3e24af473f644d1172abb6d18a4d51a3b96cc832e735e",
        "03e203bc387cda09b24f53c30bf1d5ce97cc45d6a3d14778456392cc9726ea5b"]),
    (2, "llama", "float32"): ("c9e1e0d4be9ec7251b8cbb80a044cb2fd5eeb739a73b2dd28499120cb69e94d1", [
        "a15684bc8a375f34dbd3da375032644e43ff0076c00e921278b891bcc9a03393",
        "1abb1f6f13da062dafacf21f17b1113bf7407527fe1264e6f0482a04d351a8f2",
        "22203da47618730dff2e58cb2b66072999052b41264aa655bcd8fceda8444ac0"]),
    (2, "bert", "float16"): ("6b7f12480e278ee43c0c614340247585aa9699a9a86bf6d49b4fd77ce52ccd8b", [
        "02130588cfe50411d7c91050cea81130ae976a37869ac050444427034be56b87"]),
}
