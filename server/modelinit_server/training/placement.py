"""Where a stored tensor's elements sit in an in-memory tensor, read off probes of it.

A stack's own code says how its in-memory tensors become the stored ones (transformers' reverse
conversions, torchtitan's state-dict hooks and adapter, Megatron's sharded state dict). That code
is run on probes, and what comes out is read back as :data:`~.fill.Box` es:

* on the meta device, an output that is a view of a probe: its storage offset and strides
  (:func:`view_box`), whatever the size;
* on index probes (each element holds its own flat index): the indices an output holds, as one
  box (:func:`pair_box`), or, when rows (or any dims) are permuted, as a box whose starts are the
  in-memory indices per dim (:func:`indexed_box`: a RoPE row order, head-grouped fused projections).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .fill import Box

#: An index probe holds one int64 per element; locating refuses more than this at once (2 GiB).
MAX_PROBE_ELEMENTS = 2**28


def all_views(outputs: dict[str, Any], probe) -> bool:
    return all(t is probe or t._base is probe for t in outputs.values())


def view_box(view, src_shape: tuple[int, ...], out_name: str, src: str) -> Box:
    """A view of a contiguous tensor of ``src_shape`` as a box of it: each dimension of the view
    that is longer than 1 steps one source dimension (the one with that stride), from the start
    its storage offset gives, without running past that dimension's end."""
    strides = [math.prod(src_shape[d + 1:]) for d in range(len(src_shape))]
    off = view.storage_offset()
    start = [int(s) for s in np.unravel_index(off, src_shape)] if src_shape else []
    d2s, used = [], set()
    for n, st in zip(view.shape, view.stride()):
        if n == 1:
            d2s.append(-1)
            continue
        cands = [d for d in range(len(src_shape)) if strides[d] == st and src_shape[d] > 1 and d not in used]
        if not cands or start[cands[0]] + n > src_shape[cands[0]]:
            raise ValueError(f"module: the stored tensor {out_name!r} is not a block of {src!r}; this conversion is not supported")
        used.add(cands[0])
        d2s.append(cands[0])
    shape = tuple(int(n) for n in view.shape)
    return tuple(start), tuple(d2s), (0,) * len(shape), shape


def pair_box(where: np.ndarray, values: np.ndarray, out_shape: tuple[int, ...], src_shape: tuple[int, ...],
              out_name: str, src: str) -> Box:
    """The elements of output ``out_name`` at flat positions ``where`` (ascending) hold source
    elements ``values``: both must be boxes, the output's dims running along distinct source
    dims (ValueError naming both otherwise)."""
    bad = ValueError(f"module: the stored tensor {out_name!r} is not made of blocks of {src!r}; this conversion is not supported")
    m = where.size
    oc = np.stack(np.unravel_index(where, out_shape)) if out_shape else np.zeros((0, m), np.int64)
    sc = np.stack(np.unravel_index(values, src_shape)) if src_shape else np.zeros((0, m), np.int64)
    o0, olen = oc.min(axis=1), oc.max(axis=1) - oc.min(axis=1) + 1
    s0, slen = sc.min(axis=1), sc.max(axis=1) - sc.min(axis=1) + 1
    if math.prod(olen.tolist()) != m or math.prod(slen.tolist()) != m:
        raise bad
    d2s, used = [], set()
    for k in range(len(out_shape)):
        if olen[k] == 1:
            d2s.append(-1)
            continue
        j = math.prod(olen[k + 1:].tolist())  # the box's element one step along dim k (where is row-major)
        diff = sc[:, j] - sc[:, 0]
        nz = np.nonzero(diff)[0]
        if nz.size != 1 or diff[nz[0]] != 1 or int(nz[0]) in used or slen[nz[0]] != olen[k]:
            raise bad
        used.add(int(nz[0]))
        d2s.append(int(nz[0]))
    if any(slen[d] > 1 and d not in used for d in range(len(src_shape))):
        raise bad
    expect = np.repeat(s0[:, None], m, axis=1)
    grid = np.indices(olen.tolist()).reshape(len(out_shape), -1) if out_shape else np.zeros((0, m), np.int64)
    for k, d in enumerate(d2s):
        if d >= 0:
            expect[d] += grid[k]
    if not np.array_equal(np.ravel_multi_index(expect, src_shape) if src_shape else np.zeros(m, np.int64), values):
        raise bad
    return (tuple(int(v) for v in s0), tuple(d2s), tuple(int(v) for v in o0), tuple(int(v) for v in olen))


def indexed_box(values: np.ndarray, out_shape: tuple[int, ...], src_shape: tuple[int, ...], out_name: str,
                src: str) -> Box:
    """An output of ``out_shape`` whose elements hold the flat indices ``values`` (row-major) of a
    source of ``src_shape``, every element from that source, as a box of it: each output dim runs
    along one source dim through the indices it holds there (an index array; a plain start where
    they are consecutive). ValueError naming both when the map is not such a product (an element
    from two places, a dim mixing two)."""
    bad = ValueError(f"module: the stored tensor {out_name!r} is not a product of index maps of {src!r}; "
                     "this layout is not supported")
    m = math.prod(out_shape)
    if values.size != m:
        raise bad
    coords = np.stack(np.unravel_index(values, src_shape)).reshape((len(src_shape), *out_shape))
    start: list[Any] = [0] * len(src_shape)
    d2s = [-1] * len(out_shape)
    for d in range(len(src_shape)):
        c = coords[d]
        varies = [k for k in range(len(out_shape)) if out_shape[k] > 1 and np.ptp(c, axis=k).any()]
        if len(varies) > 1:
            raise bad
        if not varies:
            start[d] = int(c.reshape(-1)[0]) if m else 0
            continue
        k = varies[0]
        if d2s[k] != -1:
            raise bad
        d2s[k] = d
        along = np.moveaxis(c, k, 0).reshape(out_shape[k], -1)[:, 0].astype(np.int64)
        if np.unique(along).size != along.size:  # distinct per dim, and a product: every element once
            raise bad
        consecutive = np.array_equal(along, np.arange(along[0], along[0] + along.size))
        start[d] = int(along[0]) if consecutive else along
    if any(n > 1 and d2s[k] == -1 for k, n in enumerate(out_shape)):
        raise bad
    return tuple(start), tuple(d2s), (0,) * len(out_shape), tuple(int(n) for n in out_shape)
