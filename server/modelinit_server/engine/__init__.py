"""modelinit numerical core: seeded, slice-able, bit-reproducible tensor initialization (numpy reference).

The bytes of every generated tensor are a pure function of (seed, tensor name, sampler, dtype, element
index) under :data:`ALGORITHM_VERSION`; see ``docs/determinism.md`` for the normative specification.
This package is the plain reference implementation: numpy only (no grpc, no torch). Faster CPU/GPU
kernels must reproduce its bytes exactly.
"""
from __future__ import annotations

from .core import DTYPE_ITEMSIZE, DTYPES, SAFETENSORS_DTYPE, check_dtype, generate, generate_array
from .philox import philox4x32_10, tensor_key
from .sampler import KINDS, Sampler, TruncScalars
from .special import log_ieee, normal_ppf, std_normal_cdf

#: Version of the generation algorithm. Bytes for a given (seed, name, sampler, dtype) never change
#: within a version; any change to them needs a new version (and new golden vectors).
ALGORITHM_VERSION: int = 1

__all__ = [
    "ALGORITHM_VERSION",
    "DTYPES",
    "DTYPE_ITEMSIZE",
    "KINDS",
    "SAFETENSORS_DTYPE",
    "Sampler",
    "TruncScalars",
    "check_dtype",
    "generate",
    "generate_array",
    "log_ieee",
    "normal_ppf",
    "philox4x32_10",
    "std_normal_cdf",
    "tensor_key",
]
