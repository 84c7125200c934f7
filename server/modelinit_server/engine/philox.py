"""Philox4x32-10 counter-based generator and the per-tensor key derivation (algorithm versions 1 and 2).

Philox4x32-10 is the generator of Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as
easy as 1, 2, 3" (SC 2011), as implemented in Random123: a bijection of a 128-bit counter under
a 64-bit key. Element ``i`` of a tensor takes its 32 random bits from lane ``i % 4`` of the
block for counter ``i // 4``, so any element can be computed without computing the others.

Everything here is exact integer arithmetic; numpy does it in ``uint64`` lanes (a 32 x 32 -> 64
bit product fits exactly), masking back to 32 bits where Philox wraps.
"""
from __future__ import annotations

import hashlib
import operator

import numpy as np
from modelinit_wire.constants import ALGORITHM_VERSION, ALGORITHM_VERSIONS

__all__ = [
    "ALGORITHM_VERSION",
    "ALGORITHM_VERSIONS",
    "KEY_DOMAIN",
    "KEY_DOMAINS",
    "canonical_name",
    "philox4x32_10",
    "philox_lanes",
    "tensor_key",
    "random_bits",
]

#: Domain-separation prefix of the key hash (version 1). Never change it: it is part of every byte.
KEY_DOMAIN = b"modelinit-v1\x00"

#: The key-hash prefix of each algorithm version. Versions differ only in the key derivation:
#: version 2 hashes the *canonical* tensor name (see :func:`canonical_name`) under its own domain.
#: Never change an entry: each is part of every byte of its version.
KEY_DOMAINS: dict[int, bytes] = {1: KEY_DOMAIN, 2: b"modelinit-v2\x00"}

# ALGORITHM_VERSIONS (every version, oldest first) and ALGORITHM_VERSION (the newest) are the
# wire's (modelinit_wire.constants): the client offers them without the engine. Each needs its
# key domain above.
if tuple(KEY_DOMAINS) != ALGORITHM_VERSIONS:
    raise ImportError(f"engine: key domains for versions {tuple(KEY_DOMAINS)}, but the wire has {ALGORITHM_VERSIONS}")

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
ROUNDS = 10

_MASK32 = np.uint64(0xFFFFFFFF)
_M0 = np.uint64(PHILOX_M0)
_M1 = np.uint64(PHILOX_M1)
_SHIFT32 = np.uint64(32)


def _round_keys(key: tuple[int, int]) -> list[tuple[np.uint64, np.uint64]]:
    """The (k0, k1) of each of the 10 rounds: round r (0-based) uses (k0 + r*W0, k1 + r*W1) mod 2**32."""
    k0, k1 = _check_key(key)
    return [
        (np.uint64((k0 + r * PHILOX_W0) & 0xFFFFFFFF), np.uint64((k1 + r * PHILOX_W1) & 0xFFFFFFFF))
        for r in range(ROUNDS)
    ]


def _check_key(key: tuple[int, int]) -> tuple[int, int]:
    try:
        k0, k1 = (operator.index(k) for k in key)
    except (TypeError, ValueError):
        raise ValueError(f"key: must be a pair of 32-bit unsigned integers, got {key!r}") from None
    if not (0 <= k0 <= 0xFFFFFFFF and 0 <= k1 <= 0xFFFFFFFF):
        raise ValueError(f"key: must be a pair of 32-bit unsigned integers, got {key!r}")
    return k0, k1


def philox_lanes(
    c0: np.ndarray, c1: np.ndarray, c2: np.ndarray, c3: np.ndarray, key: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Philox4x32-10 on counter words given as four equal-length ``uint64`` arrays of 32-bit values.

    The arrays are overwritten in place and returned holding the four output words. One round, with
    ``(k0, k1)`` the round key::

        (hi0, lo0) = mulhilo32(M0, c0);  (hi1, lo1) = mulhilo32(M1, c2)
        c = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)

    The 32 x 32 -> 64 bit products are exact in uint64. Only the two products are temporaries.
    """
    p0 = np.empty_like(c0)
    p1 = np.empty_like(c0)
    for k0, k1 in _round_keys(key):
        np.multiply(c0, _M0, out=p0)
        np.multiply(c2, _M1, out=p1)
        np.right_shift(p1, _SHIFT32, out=c0)  # c0 = hi1
        np.bitwise_xor(c0, c1, out=c0)  # ^ c1 (old c1: overwritten only below)
        np.bitwise_xor(c0, k0, out=c0)  # ^ k0
        np.bitwise_and(p1, _MASK32, out=c1)  # c1 = lo1
        np.right_shift(p0, _SHIFT32, out=c2)  # c2 = hi0
        np.bitwise_xor(c2, c3, out=c2)  # ^ c3 (old c3)
        np.bitwise_xor(c2, k1, out=c2)  # ^ k1
        np.bitwise_and(p0, _MASK32, out=c3)  # c3 = lo0
    return c0, c1, c2, c3


def philox4x32_10(counters: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """Philox4x32-10 of each row of ``counters`` (shape ``(N, 4)``, 32-bit unsigned values) under ``key = (k0, k1)``.

    Returns an ``(N, 4)`` ``uint32`` array: row ``j`` is the 128-bit output block for counter row ``j``,
    word order as in Random123 (``ctr.v[0..3]``).
    """
    arr = np.asarray(counters)
    if arr.ndim != 2 or arr.shape[1] != 4:
        raise ValueError(f"counters: must have shape (N, 4), got {arr.shape}")
    if arr.size and (arr.dtype.kind not in "ui" or arr.min() < 0 or arr.max() > 0xFFFFFFFF):
        raise ValueError("counters: must hold 32-bit unsigned integer values")
    c = arr.astype(np.uint64)
    words = philox_lanes(c[:, 0].copy(), c[:, 1].copy(), c[:, 2].copy(), c[:, 3].copy(), key)
    out = np.empty(arr.shape, dtype=np.uint32)
    for j in range(4):
        out[:, j] = words[j]
    return out


#: Largest element index + 1 that generation accepts (counters stay far inside 64 bits).
MAX_ELEMENTS = 1 << 62


def random_bits(key: tuple[int, int], start: int, count: int) -> np.ndarray:
    """The 32 random bits of elements ``[start, start + count)`` of a tensor, as a ``uint64`` array.

    Element ``i`` uses counter ``c = i // 4`` laid out as ``(c & 0xffffffff, c >> 32, 0, 0)`` and takes
    output word ``i % 4``. Only the counter blocks that overlap the range are computed.
    """
    if count == 0:
        return np.empty(0, dtype=np.uint64)
    first = start // 4
    last = (start + count - 1) // 4
    n = last - first + 1
    ctr = np.arange(first, last + 1, dtype=np.uint64)
    words = philox_lanes(ctr & _MASK32, ctr >> _SHIFT32, np.zeros(n, np.uint64), np.zeros(n, np.uint64), key)
    del ctr
    block = np.empty((n, 4), dtype=np.uint64)
    for j in range(4):
        block[:, j] = words[j]  # element 4*c + j takes word j of counter c
    off = start - 4 * first
    return block.reshape(-1)[off : off + count]


def canonical_name(name: str, base_model_prefix: str) -> str:
    """The name version 2 keys a tensor by: ``name`` without a leading ``base_model_prefix + "."``.

    ``canonical_name("bert.encoder.layer.0.output.dense.weight", "bert")`` is
    ``"encoder.layer.0.output.dense.weight"``, the name the same tensor has in ``BertModel``. Names
    outside the base model (heads: ``cls.predictions.bias``, ``lm_head.weight``) and every name
    when the prefix is empty (a base class) are kept whole. Only a whole leading component is
    removed: ``"bertx.w"`` keeps its name under prefix ``"bert"``.
    """
    if base_model_prefix and name.startswith(base_model_prefix + "."):
        return name[len(base_model_prefix) + 1 :]
    return name


def tensor_key(seed: int, name: str, version: int = 1) -> tuple[int, int]:
    """The Philox key of the tensor named ``name`` under ``seed``, in algorithm ``version``.

    ``d = sha256(KEY_DOMAINS[version] + seed.to_bytes(8, "little") + name.encode("utf-8"))``;
    ``k0`` and ``k1`` are the little-endian ``uint32`` of ``d[0:4]`` and ``d[4:8]``. The domain is
    ``b"modelinit-v1\\x00"`` for version 1 and ``b"modelinit-v2\\x00"`` for version 2.

    ``name`` is hashed as given: version 1 hashes the full HF name, version 2 the canonical name,
    which the caller derives with :func:`canonical_name` (the planner does). ``version`` defaults
    to 1 only for the engine's own low-level uses (kernel tests, benchmarks, where any key will do);
    code that makes a model's tensors always passes the request's version.
    """
    if isinstance(version, bool) or not isinstance(version, int) or version not in KEY_DOMAINS:
        raise ValueError(f"algorithm_version: unknown version {version!r}; use one of {list(ALGORITHM_VERSIONS)}")
    if isinstance(seed, bool):
        raise ValueError(f"seed: must be an integer in [0, 2**64), got {seed!r}")
    try:
        s = operator.index(seed)
    except TypeError:
        raise ValueError(f"seed: must be an integer in [0, 2**64), got {seed!r}") from None
    if not 0 <= s < 1 << 64:
        raise ValueError(f"seed: must be an integer in [0, 2**64), got {s}")
    if not isinstance(name, str):
        raise ValueError(f"name: must be a str, got {type(name).__name__}")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"name: not encodable as UTF-8 ({e.reason})") from None
    d = hashlib.sha256(KEY_DOMAINS[version] + s.to_bytes(8, "little") + encoded).digest()
    return int.from_bytes(d[0:4], "little"), int.from_bytes(d[4:8], "little")
