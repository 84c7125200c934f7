"""Tensors and n-d slices of them, without the files: what the ``Tensors`` RPC streams.

Element i of a tensor is generated independently of every other, so a block is produced by
generating only the runs of consecutive flat (row-major) indices it covers (engine/runs.py: one
run per index of the leading dimensions, the trailing whole dimensions folded into it), many runs
per launch. The bytes equal the same
elements of the files (the same fill writes both). Used by the servicer and the embedded engine.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np
from modelinit_wire.constants import DEFAULT_CHUNK, MAX_CHUNK
from modelinit_wire.v1 import modelinit_pb2 as pb

from ..core.planner import Plan, TensorPlan
from ..engine import DTYPE_ITEMSIZE
from ..engine.backends import REFERENCE, FillRuns
from ..engine.runs import box_runs
from .file_bytes import SEGMENT

#: Most selected bytes one Tensors call streams (4 GiB); more is INVALID_ARGUMENT. Memory does not
#: grow with it (a call holds a couple of SEGMENT buffers); it bounds how long one call ties up a
#: stream slot. Split larger selections over several calls.
MAX_TENSORS_BYTES = 4 << 30


@dataclass(frozen=True)
class Selection:
    """A checked selection: the tensor and the block, one (start, stop) per dimension."""

    index: int
    tensor: TensorPlan
    dims: tuple[tuple[int, int], ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in self.dims)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def check_chunk(chunk_size: int) -> int:
    """A stream's chunk size in bytes (Init's and Tensors' ``chunk_size``; 0: the default); ValueError
    naming ``chunk_size`` above the max."""
    if chunk_size > MAX_CHUNK:
        raise ValueError(f"chunk_size: {chunk_size} bytes is over the {MAX_CHUNK}-byte maximum; use 1048576 or 0")
    return chunk_size or DEFAULT_CHUNK


def select(plan: Plan, request: pb.TensorsRequest) -> list[Selection]:
    """The request's selections, checked against the plan (ValueError naming the field)."""
    if not request.selections:
        out = [Selection(i, t, tuple((0, n) for n in t.spec.shape)) for i, t in enumerate(plan.tensors)]
    else:
        by_name = {t.spec.name: t for t in plan.tensors}
        tied = dict(plan.request.model.tied)
        out = []
        for i, sel in enumerate(request.selections):
            field = f"selections[{i}]"
            t = by_name.get(sel.name)
            if t is None:
                shown = sel.name if len(sel.name) <= 200 else sel.name[:197] + "..."
                if sel.name in tied:
                    raise ValueError(f"{field}.name: {shown!r} is tied to {tied[sel.name]!r} and not stored; select that one")
                raise ValueError(f"{field}.name: no stored tensor is named {shown!r}; the names are PlanResponse.tensors[].name "
                                 "(Plan with page_size)")
            shape = t.spec.shape
            if not sel.dims:
                dims = tuple((0, n) for n in shape)
            elif len(sel.dims) != len(shape):
                raise ValueError(f"{field}.dims: {len(sel.dims)} dimensions given, {sel.name!r} has {len(shape)} "
                                 f"(shape {list(shape)}); give one per dimension, or none for the whole tensor")
            else:
                parts = []
                for d, (sd, n) in enumerate(zip(sel.dims, shape)):
                    stop = sd.stop if sd.HasField("stop") else n
                    if stop > n:
                        raise ValueError(f"{field}.dims[{d}].stop: {stop} is past the end of dimension {d} of {sel.name!r} "
                                         f"(size {n}, shape {list(shape)})")
                    if sd.start > stop:
                        raise ValueError(f"{field}.dims[{d}].start: {sd.start} is after stop {stop} (empty ranges have "
                                         "start == stop)")
                    parts.append((sd.start, stop))
                dims = tuple(parts)
            out.append(Selection(i, t, dims))
    total = sum(s.numel for s in out) * DTYPE_ITEMSIZE[plan.request.dtype]
    if total > MAX_TENSORS_BYTES:
        raise ValueError(f"selections: {total:,} bytes selected, over the limit of {MAX_TENSORS_BYTES:,} per Tensors call; "
                         "split them over several calls")
    return out


def runs(shape: tuple[int, ...], dims: tuple[tuple[int, int], ...]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The block's elements as batches of (first flat index, count) runs, in row-major order."""
    return box_runs(shape, [None if (a, b) == (0, n) else np.arange(a, b, dtype=np.int64)
                            for (a, b), n in zip(dims, shape)])


def _take(starts: np.ndarray, counts: np.ndarray, cum: np.ndarray, p: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Elements [p, p + n) of the runs' concatenation (``cum``: its running totals), as runs."""
    i = int(np.searchsorted(cum, p, side="right"))  # the run holding element p
    j = int(np.searchsorted(cum, p + n, side="left"))  # the run holding element p + n - 1
    s, c = starts[i : j + 1].copy(), counts[i : j + 1].copy()
    cut = p - int(cum[i] - counts[i])
    s[0] += cut
    c[0] -= cut
    c[-1] -= int(cum[j]) - (p + n)
    return s, c


class OutOfRange(IndexError):
    """A resume point past the end: OUT_OF_RANGE, as Init's offset (an IndexError, so that the
    embedded client tells it from a bad request without importing this module)."""


def resume(selections: list[Selection], start: int, offset: int, dtype: str) -> list[Selection]:
    """The selections from ``start`` on, after checking that ``offset`` bytes of the first exist."""
    if start and start >= len(selections):
        raise OutOfRange(f"start: selection {start} is past the last one ({len(selections) - 1})")
    rest = selections[start:]
    nbytes = rest[0].numel * DTYPE_ITEMSIZE[dtype] if rest else 0
    if offset > nbytes:
        raise OutOfRange(f"offset: {offset} is past the end of selection {start} ({nbytes} bytes)")
    return rest


def blocks(plan: Plan, selections: list[Selection], fill_runs: FillRuns = REFERENCE.fill_runs,
           segment: int = SEGMENT, offset: int = 0) -> Iterator[Selection | np.ndarray]:
    """For each selection: the Selection, then its bytes as uint8 arrays of at most ``segment``
    bytes (each array is fresh, valid after the next one is made). The first selection's data
    starts at byte ``offset`` (a resumed stream; it may fall inside an element)."""
    dtype = plan.request.dtype
    itemsize = DTYPE_ITEMSIZE[dtype]
    per = max(segment // itemsize, 1)  # elements per buffer
    for k, sel in enumerate(selections):
        yield sel
        skip, cut = divmod(offset, itemsize) if k == 0 else (0, 0)  # whole elements, then bytes of the next
        t = sel.tensor
        left = sel.numel - skip
        buf, used = np.empty(min(left, per) * itemsize, np.uint8), 0
        for starts, counts in runs(t.spec.shape, sel.dims):
            cum = np.cumsum(counts)
            total = int(cum[-1])
            if skip >= total:
                skip -= total
                continue
            p, skip = skip, 0
            while p < total:
                n = min(per - used, total - p)
                s, c = _take(starts, counts, cum, p, n)
                fill_runs(buf[used * itemsize : (used + n) * itemsize], t.sampler, t.key, s, c, dtype)
                used, p, left = used + n, p + n, left - n
                if used == per:
                    yield buf[cut:]
                    buf, used, cut = np.empty(min(left, per) * itemsize, np.uint8), 0, 0
        if used and used * itemsize > cut:
            yield buf[cut : used * itemsize]


def begin(plan: Plan, sel: Selection, offset: int = 0) -> pb.TensorsResponse:
    """The TensorBegin that starts ``sel`` (its data from byte ``offset`` on)."""
    dtype = plan.request.dtype
    return pb.TensorsResponse(begin=pb.TensorBegin(
        index=sel.index, name=sel.tensor.spec.name, dtype=dtype, tensor_shape=sel.tensor.spec.shape,
        dims=[pb.SliceDim(start=a, stop=b) for a, b in sel.dims], shape=sel.shape,
        nbytes=sel.numel * DTYPE_ITEMSIZE[dtype], fingerprint=plan.fingerprint, offset=offset))


def responses(plan: Plan, request: pb.TensorsRequest, fill_runs: FillRuns = REFERENCE.fill_runs
              ) -> Iterator[pb.TensorsResponse]:
    """The whole Tensors stream of ``request`` in-process (ValueError naming the field, before
    anything is generated)."""
    chunk = check_chunk(request.chunk_size)
    selections = resume(select(plan, request), request.start, request.offset, plan.request.dtype)
    offset = request.offset
    for item in blocks(plan, selections, fill_runs, offset=offset):
        if isinstance(item, Selection):
            yield begin(plan, item, offset)
            offset = 0
        else:
            for a in range(0, len(item), chunk):
                yield pb.TensorsResponse(data=item[a : a + chunk].tobytes())
