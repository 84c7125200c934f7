"""Blocks of a tensor as runs of consecutive flat indices: what a fill of a slice or a shard needs.

A block is the Cartesian product of one sorted list of indices per dimension (a slice: a range; a
DTensor shard: whatever its placements give). In row-major order its elements form runs of
consecutive flat indices: the trailing whole dimensions fold into the last partial one, and that
dimension's consecutive indices join. :func:`box_runs` lists them as int64 arrays, in batches of
bounded size (a thin column of a huge matrix is millions of one-element runs), for
``fill_runs`` (engine/backends.py), which generates them in one launch.
"""
from __future__ import annotations

import math
from typing import Iterator, Sequence

import numpy as np

__all__ = ["box_runs", "MAX_RUNS"]

#: Runs per batch (16 bytes each): bounds the memory of the index arrays, not the work.
MAX_RUNS = 1 << 16


def box_runs(shape: Sequence[int], index: Sequence[np.ndarray | None],
             max_runs: int = MAX_RUNS) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(starts, counts) batches of the block ``index`` of a tensor of ``shape``, in row-major order.

    ``index[d]``: the sorted, distinct indices of dimension ``d`` in the block, or None for all of
    it. Each batch has at most ``max_runs`` runs, unless one index of the leading dimensions alone
    has more. Nothing is yielded for an empty block."""
    shape = [int(n) for n in shape]
    m = len(shape)
    if any(ix is not None and len(ix) == 0 for ix in index) or 0 in shape:
        return
    strides = [math.prod(shape[k + 1:]) for k in range(m)]
    q = m - 1  # the last dimension that is not whole; those after it fold into its runs
    while q >= 0 and (index[q] is None or len(index[q]) == shape[q]):
        q -= 1
    if q < 0:
        yield np.zeros(1, np.int64), np.full(1, math.prod(shape), np.int64)
        return
    idx = np.asarray(index[q], dtype=np.int64)
    breaks = np.nonzero(np.diff(idx) != 1)[0] + 1
    first = idx[np.concatenate(([0], breaks))] * strides[q]
    length = np.diff(np.concatenate(([0], breaks, [idx.size]))) * strides[q]
    lead = [np.arange(shape[k], dtype=np.int64) if index[k] is None else np.asarray(index[k], dtype=np.int64)
            for k in range(q)]
    sizes = [len(v) for v in lead]
    combos = math.prod(sizes)
    per = max(1, max_runs // len(first))
    for c0 in range(0, combos, per):
        c = np.arange(c0, min(c0 + per, combos), dtype=np.int64)
        base = np.zeros(c.size, np.int64)
        for k, pos in enumerate(np.unravel_index(c, sizes) if sizes else ()):
            base += lead[k][pos] * strides[k]
        yield (base[:, None] + first[None, :]).reshape(-1), np.broadcast_to(length, (c.size, len(first))).reshape(-1)
