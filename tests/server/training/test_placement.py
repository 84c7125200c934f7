"""Reading a stored tensor's place in an in-memory one off an index probe (``training.placement``):
a box with index arrays where rows are permuted (a RoPE row order, head-grouped fused
projections), a plain box where they are consecutive, dims swapped, and a refusal, naming both
tensors, for a map that is not a product of per-dim index maps."""
from __future__ import annotations

import numpy as np
import pytest
from modelinit_server.training.placement import indexed_box

torch = pytest.importorskip("torch")


def _probe(shape):
    return torch.arange(int(np.prod(shape)), dtype=torch.int64).view(shape)


def test_permuted_rows_are_an_index_array_and_whole_columns_a_start():
    w = _probe((8, 5))
    order = [0, 2, 4, 6, 1, 3, 5, 7]  # the RoPE half split of one head
    out = w[order][:, 1:4]
    start, d2s, disk_start, length = indexed_box(out.reshape(-1).numpy(), (8, 3), (8, 5), "q", "wq")
    assert list(start[0]) == order and start[1] == 1 and d2s == (0, 1) and length == (8, 3) and disk_start == (0, 0)


def test_a_transpose_maps_dims_across():
    w = _probe((3, 4))
    start, d2s, _, length = indexed_box(w.t().reshape(-1).numpy(), (4, 3), (3, 4), "t", "w")
    assert start == (0, 0) and d2s == (1, 0) and length == (4, 3)


def test_a_map_that_is_no_product_is_refused_naming_both():
    w = _probe((4, 4))
    mixed = w.reshape(-1).flip(0)[:8].reshape(2, 4)  # rows run backwards: fine; now swap two elements
    values = mixed.reshape(-1).numpy().copy()
    values[[0, 5]] = values[[5, 0]]
    with pytest.raises(ValueError, match=r"'out' is not a product of index maps of 'w'"):
        indexed_box(values, (2, 4), (4, 4), "out", "w")
    with pytest.raises(ValueError, match=r"'dup' is not a product"):
        indexed_box(np.zeros(4, np.int64), (2, 2), (4, 4), "dup", "w")
