"""modelinit numerical core: seeded, slice-able, bit-reproducible tensor initialization (numpy reference).

The bytes of every generated tensor are a pure function of (algorithm version, seed, tensor name,
sampler, dtype, element index); the versions are :data:`ALGORITHM_VERSIONS`, the newest
:data:`ALGORITHM_VERSION`; see ``docs/determinism.md`` for the normative specification.
This package is the plain reference implementation: numpy only (no grpc, no torch). Faster CPU/GPU
kernels must reproduce its bytes exactly.
"""
from __future__ import annotations

from .core import DTYPE_ITEMSIZE, DTYPES, SAFETENSORS_DTYPE, check_dtype, generate, generate_array
from .philox import ALGORITHM_VERSION, ALGORITHM_VERSIONS, canonical_name, philox4x32_10, tensor_key
from .sampler import KINDS, Sampler, TruncScalars
from .special import log_ieee, normal_ppf, std_normal_cdf

# ALGORITHM_VERSION (the newest, 2) and ALGORITHM_VERSIONS (every supported one, (1, 2)) come from
# .philox, where the versions' key derivations live. Bytes for a given (version, seed, name,
# sampler, dtype) never change; any change to them needs a new version (and new golden vectors),
# and every old version stays available.

__all__ = [
    "ALGORITHM_VERSION",
    "ALGORITHM_VERSIONS",
    "DTYPES",
    "DTYPE_ITEMSIZE",
    "KINDS",
    "SAFETENSORS_DTYPE",
    "Sampler",
    "TruncScalars",
    "canonical_name",
    "check_dtype",
    "generate",
    "generate_array",
    "log_ieee",
    "normal_ppf",
    "philox4x32_10",
    "std_normal_cdf",
    "tensor_key",
]
