"""The engine: seeded, slice-able, bit-reproducible tensor initialization.

The bytes of every generated tensor are a pure function of (algorithm version, seed, tensor name,
sampler, dtype, element index); the versions are :data:`ALGORITHM_VERSIONS`, the newest
:data:`ALGORITHM_VERSION`; see ``docs/determinism.md`` for the normative specification.

What the package holds:

* The reference, which defines the bytes (numpy only): ``philox`` (Philox4x32-10 and the per-tensor
  key of each version), ``special`` (``log_ieee``, the AS241 ``normal_ppf``, the exact host-side
  ``std_normal_cdf``, and every constant of the algorithm), ``sampler`` (:class:`Sampler`, one
  resolved distribution, and its host scalars) and ``reference`` (:func:`generate` / :func:`generate_array`,
  dtype rounding, and the argument checks and host scalars that the kernels share with it).
* ``scalar``: the same algorithm one element at a time in plain Python (the line-by-line model of
  the spec, for tests and debugging).
* ``cpu``: the numba CPU kernel; ``cuda``: the Triton GPU kernel (torch tensors). Both must
  reproduce the reference's bytes exactly, and the tests check that they do.
* ``backends``: picks where the bytes are computed (reference, numba or Triton); ``runs``: a block
  of a tensor (a slice, a shard) as runs of consecutive flat indices (the kernels size their
  threads by ``modelinit_host.usable_cores``: CPU affinity capped by a cgroup quota);
  ``host_values``: a computed tensor's float64 values, rounded and copied instead of drawn.

What it imports: numpy and ``modelinit_wire.constants`` (the algorithm versions, dtypes and devices
shared with the client). numba (with llvmlite) is imported only by ``cpu``, and triton and torch only
by ``cuda`` (torch inside the functions that need it) and by ``backends`` when that kernel is
selected. Importing this package imports neither ``cpu`` nor ``cuda``, so it works, and stays
numpy-only, where numba, torch and triton are missing. Never grpc (an import-linter contract in
``pyproject.toml``) and never the client package.
"""
from __future__ import annotations

from .reference import DTYPE_ITEMSIZE, DTYPES, SAFETENSORS_DTYPE, check_dtype, generate, generate_array
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
