"""Computed: a tensor whose values a model's own code computes on the host instead of drawing them.

Mamba's ``A_log = log(arange(1, N + 1))``, a sinusoidal position table, ``dt_bias`` drawn
log-uniform then passed through the inverse softplus: the values come from a provider (the
architecture's replay of its own initialization, every random draw taken from the engine) as
float64, once per tensor, and are only rounded and copied here. Rounding is the engine's
(:func:`~.reference.to_dtype`, round-to-nearest-even), so the bytes of a given float64 array are the
same everywhere; docs/determinism.md says which providers' float64 values are portable.

A ``Computed`` stands where a :class:`~.sampler.Sampler` stands in a plan (``kind == "computed"``);
the backends copy its bytes instead of running a kernel.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ClassVar

import numpy as np

from .reference import DTYPE_ITEMSIZE, check_runs, to_dtype

__all__ = ["Computed"]


@dataclass(frozen=True)
class Computed:
    """Host-computed values of one tensor, in the tensor's flat (row-major) order."""

    kind: ClassVar[str] = "computed"
    zero_row: ClassVar[None] = None

    name: str
    """The stored tensor's name (for errors)."""
    source: str
    """What computes it, shown in plans and ``explain`` (e.g. ``init.copy_ in MambaMixer.init_mamba_weights``)."""
    numel: int = 0
    """Number of elements the provider must return."""
    values: Callable[[], np.ndarray] | None = field(default=None, compare=False, repr=False)
    """Returns the float64 values (``numel`` of them); None until the plan binds it to a seed."""
    _cache: dict = field(default_factory=dict, compare=False, repr=False, init=False)

    def array(self, dtype: str) -> np.ndarray:
        """The values rounded to ``dtype`` (the engine's array type per dtype), computed once."""
        if dtype not in self._cache:
            if self.values is None:
                raise ValueError(f"{self.name}: computed values are not bound to a seed")
            v = np.asarray(self.values(), dtype=np.float64).reshape(-1)
            if v.size != self.numel:
                raise ValueError(f"{self.name}: the provider computed {v.size} values, the tensor has {self.numel}")
            with np.errstate(over="ignore"):
                out = to_dtype(v, dtype)
            self._cache[dtype] = np.ascontiguousarray(out)
        return self._cache[dtype]

    def check_dtype(self, dtype: str) -> None:
        """ValueError if a finite value overflows ``dtype`` (values the model makes infinite stay infinite)."""
        v = np.asarray(self.values() if self.values is not None else [], dtype=np.float64)
        finite = np.isfinite(v)
        out = self.array(dtype)
        back = out.astype(np.float64) if dtype != "bfloat16" else (out.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        if np.any(finite & ~np.isfinite(back)):
            raise ValueError(f"a computed value overflows {dtype}")

    def fill(self, out: np.ndarray, start: int, count: int, dtype: str) -> None:
        """Bytes of elements [start, start + count) into ``out`` (uint8, count * itemsize bytes)."""
        item = DTYPE_ITEMSIZE[dtype]
        out[:] = self.array(dtype).view(np.uint8)[start * item : (start + count) * item]

    def fill_runs(self, out: np.ndarray, starts, counts, dtype: str) -> None:
        """Bytes of every run [starts[r], starts[r] + counts[r]), back to back in ``out``."""
        starts, counts = check_runs(starts, counts)
        item = DTYPE_ITEMSIZE[dtype]
        src = self.array(dtype).view(np.uint8)
        pos = 0
        for s, c in zip(starts.tolist(), counts.tolist()):
            out[pos : pos + c * item] = src[s * item : (s + c) * item]
            pos += c * item
