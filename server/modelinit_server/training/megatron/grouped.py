"""Megatron's ``GroupedMLP`` experts: one weight per layer for all its local experts, each expert's
tensor transposed in the view its grouped GEMM takes (``weight1`` [hidden, local experts x fc1
rows] is [local experts, hidden, rows] in memory; ``weight2`` [local experts x fc2 columns, hidden]
is [local experts, columns, hidden]), read off Megatron's ``sharded_state_dict()``; and FSDP2's
shard of one as runs of its memory."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtensor import local_and_index_sets
from ..fill import Box
from ..stack import Run


@dataclass(frozen=True)
class GroupedPlace:
    """Where a GroupedMLP weight's experts sit."""

    key: str
    """Megatron's checkpoint key (``...mlp.experts.experts.linear_fc1.weight`` or ``linear_fc2``)."""
    layer: int
    """The global layer."""
    view: tuple[int, ...]
    """The local weight as its grouped GEMM views it: (local experts, X, Y)."""
    whole: tuple[int, ...]
    """The whole layer's tensor in the same layout (every expert, every tensor-parallel rank's rows or columns)."""
    held: list
    """The global indices the view holds per dim (None: all of it)."""
    experts: list[int]
    """The global experts held."""
    expert_shape: tuple[int, int]
    """One expert's Megatron shape (rows, columns)."""


def grouped_place(name: str, t, sharded: list[Any]) -> GroupedPlace | None:
    """For a ``GroupedMLP`` weight (``weight1`` [hidden, local experts x fc1 rows], in memory
    [local experts, hidden, rows]; ``weight2`` [local experts x fc2 columns, hidden], in memory
    [local experts, columns, hidden]: its grouped GEMM's views): the key, the layer, the view's
    shape, the whole layer's tensor in the same layout (every expert, every TP rank's rows or
    columns), the global indices the view holds per dim, the global experts held and one expert's
    Megatron shape. None for any other tensor. Read off the ShardedTensors of Megatron's own
    ``sharded_state_dict()`` (which saves each expert's ``linear_fc1``/``linear_fc2`` transposed out
    of the view, as copies): each is (local experts, rows, columns) at (layer, first expert, row
    offset, column offset) of (layers, experts, rows, columns)."""
    keys = {s.key for s in sharded}
    if t.dim() != 2 or len(keys) != 1 or not next(iter(keys)).endswith(
            ("mlp.experts.experts.linear_fc1.weight", "mlp.experts.experts.linear_fc2.weight")) \
            or any(s.data.dim() != 3 or s.prepend_axis_num != 1 for s in sharded):
        return None
    key = keys.pop()
    layers, firsts, shapes = ({s.global_offset[0] for s in sharded}, {s.global_offset[1] for s in sharded},
                              {tuple(s.global_shape[1:]) for s in sharded})
    counts = {s.local_shape[0] for s in sharded}
    if len(layers) != 1 or len(firsts) != 1 or len(shapes) != 1 or len(counts) != 1:
        raise ValueError(f"module: Megatron saves {name!r} (GroupedMLP) in pieces of several layers or experts; "
                         "this layout is not supported")
    (n_experts, rows, cols), first, n_local = shapes.pop(), firsts.pop(), counts.pop()
    # fc1 pieces split the rows (gate and up, each a TP rank's), fc2 its one piece the columns
    axis = 1 if key.endswith("linear_fc1.weight") else 2
    other = 2 if axis == 1 else 1
    held = np.concatenate([np.arange(s.global_offset[1 + axis], s.global_offset[1 + axis] + s.local_shape[axis],
                                     dtype=np.int64) for s in sharded])
    width = {s.local_shape[other] for s in sharded}
    if np.any(np.diff(held) <= 0) or width != {(rows, cols)[other - 1]} or held.size * n_local * width.pop() != t.numel():
        raise ValueError(f"module: Megatron's pieces of {name!r} (GroupedMLP) do not tile it; this layout is not supported")
    experts = np.arange(first, first + n_local, dtype=np.int64)
    full = (rows, cols)[axis - 1]
    held = None if held.size == full else held
    if axis == 1:  # [experts, hidden, rows]
        return GroupedPlace(key, layers.pop(), (n_local, cols, t.numel() // (n_local * cols)), (n_experts, cols, rows),
                            [experts, None, held], experts.tolist(), (rows, cols))
    return GroupedPlace(key, layers.pop(), (n_local, t.numel() // (n_local * rows), rows), (n_experts, cols, rows),
                        [experts, held, None], experts.tolist(), (rows, cols))


def grouped_runs(name: str, t, grouped: GroupedPlace) -> tuple[Run, ...]:
    """FSDP2's shard of a ``GroupedMLP`` weight (a DTensor, ``Shard(0)`` rows of the 2-D weight) as
    runs of its local elements (``Placed.runs``): the rows are a run of the weight's memory, which
    the grouped GEMM views as (local experts, X, Y); it is cut where it enters or leaves an expert,
    into at most three runs, each whole experts or whole ``Y``-rows of one (a row of the 2-D weight
    is whole ``Y``-rows of the view), each with the global indices it holds of the layer's tensor."""
    view, whole, held_idx = grouped.view, grouped.whole, grouped.held
    _, sets = local_and_index_sets(t, name)
    _, x, y = view
    rows, width = sets[0], t.shape[1]
    if any(s is not None for s in sets[1:]) or width % y or \
            (rows is not None and rows.size and np.any(np.diff(rows) != 1)):
        raise ValueError(f"module: {name!r} (GroupedMLP) is a DTensor sharded other than by runs of rows (Shard(0)); "
                         "this layout is not supported: use SequentialMLP experts (moe_grouped_gemm=False) under it")
    start, stop = (0, t.shape[0] * width) if rows is None else \
        (int(rows[0]) * width, (int(rows[-1]) + 1) * width) if rows.size else (0, 0)
    dim1 = np.arange(whole[1], dtype=np.int64) if held_idx[1] is None else held_idx[1]
    block, at, runs = x * y, start, []
    while at < stop:
        expert, within = divmod(at, block)
        if within == 0 and stop - at >= block:  # whole experts
            n = (stop - at) // block
            runs.append(Run(at - start, at - start + n * block, (n, x, y), [held_idx[0][expert:expert + n], *held_idx[1:]]))
            at += n * block
        else:  # Y-rows of one expert, to its end or the shard's
            end = min(stop, (expert + 1) * block)
            lo, hi = within // y, (end - expert * block) // y
            runs.append(Run(at - start, end - start, (1, hi - lo, y), [held_idx[0][expert:expert + 1], dim1[lo:hi],
                                                                      held_idx[2]]))
            at = end
    return tuple(runs)


def grouped_mlp_box(expert: int, box: Box) -> Box:
    """A box of one expert's Megatron tensor (``linear_fc1`` [rows, hidden], ``linear_fc2``
    [hidden, columns]) as a box of the layer's GroupedMLP tensor as its grouped GEMM views it
    ([experts, hidden, rows], [experts, columns, hidden]): the expert's tensor transposed, at
    ``expert`` along the first dim."""
    start, dims, disk_start, length = box
    if len(start) != 2 or any(isinstance(s, np.ndarray) for s in start):
        raise ValueError("module: a GroupedMLP expert's box must be a 2-D block")
    return (expert, start[1], start[0]), tuple(2 - d if d >= 0 else -1 for d in dims), disk_start, length
