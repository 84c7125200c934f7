"""What the Tensors RPC hands back to a caller: a tensor or slice as raw bytes
(:class:`TensorBytes`), the slices a caller asks for as the wire's SliceDims, and the bytes as a
numpy array or torch tensor sharing their buffer (numpy, ml_dtypes and torch imported on use)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
from modelinit_wire.v1 import modelinit_pb2 as pb

from .errors import ModelInitError


@dataclass(frozen=True)
class TensorBytes:
    """A tensor (or slice) as raw bytes: what ``Client.tensors(..., as_="bytes")`` returns."""

    data: bytearray
    """The elements in row-major order, little-endian ``dtype`` (bfloat16: the upper 16 bits of
    the float32 pattern); the same bytes as in the files."""
    shape: tuple[int, ...]
    """The block's shape (the whole tensor's when it was not sliced)."""
    dtype: str
    """``float32``, ``bfloat16`` or ``float16``."""


#: Client.tensors' ``as_`` values.
TENSOR_FORMATS = ("numpy", "torch", "bytes")


def slice_dims(name: str, dims: Any) -> list[pb.SliceDim]:
    """``slices[name]`` as SliceDims: one (start, stop) pair, ``slice(start, stop)`` or None (the
    whole dimension) per dimension; stop None: to the end. INVALID_ARGUMENT naming the entry."""
    where = f"slices[{name!r}]"
    if not isinstance(dims, (tuple, list)):
        raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"{where}: give one (start, stop) per dimension, as a tuple, got {type(dims).__name__}")
    out = []
    for d, dim in enumerate(dims):
        if dim is None:
            dim = (0, None)
        elif isinstance(dim, slice):
            if dim.step not in (None, 1):
                raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, f"{where}[{d}]: steps are not supported, got {dim.step!r}")
            dim = (dim.start or 0, dim.stop)
        if not isinstance(dim, (tuple, list)) or len(dim) != 2:
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{where}[{d}]: must be a (start, stop) pair, a slice or None, got {dim!r}")
        start, stop = dim
        for what, v in (("start", start), ("stop", stop)):
            if v is None and what == "stop":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**64:
                raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT,
                                     f"{where}[{d}].{what}: must be an integer >= 0 (no negative indices), got {v!r}")
        out.append(pb.SliceDim(start=start) if stop is None else pb.SliceDim(start=start, stop=stop))
    return out


def as_format(raw: TensorBytes, as_: str) -> Any:
    """``raw`` as a numpy array or torch tensor (sharing its buffer), or itself for ``bytes``."""
    if as_ == "bytes":
        return raw
    if as_ == "torch":
        try:
            import torch
        except ImportError:
            raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION,
                                 "as_='torch' needs torch (pip install torch); or pass as_='numpy' or as_='bytes'") from None
        tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[raw.dtype]
        if not raw.data:
            return torch.empty(raw.shape, dtype=tdtype)
        return torch.frombuffer(raw.data, dtype=tdtype).reshape(raw.shape)
    try:
        import numpy as np
    except ImportError:
        raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION,
                             "as_='numpy' needs numpy (pip install numpy); or pass as_='bytes'") from None
    if raw.dtype == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION,
                                 "as_='numpy': numpy has no bfloat16 of its own; pip install ml_dtypes (its bfloat16 is "
                                 "JAX's), or pass as_='bytes' (the raw bits) or as_='torch'") from None
        ndtype = np.dtype(ml_dtypes.bfloat16)
    else:
        ndtype = np.dtype({"float32": "<f4", "float16": "<f2"}[raw.dtype])
    return np.frombuffer(raw.data, dtype=ndtype).reshape(raw.shape)
