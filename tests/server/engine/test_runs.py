"""Blocks of a tensor as runs of flat indices (engine/runs.py), against numpy's own indexing."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from modelinit_server.engine.runs import box_runs


def flat_indices(shape, index) -> np.ndarray:
    """The block's flat indices in row-major order, the slow and obvious way."""
    whole = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    axes = [np.arange(n) if ix is None else np.asarray(ix, np.int64) for n, ix in zip(shape, index)]
    return whole[np.ix_(*axes)].reshape(-1) if shape else whole.reshape(-1)


def expand(batches) -> np.ndarray:
    parts = [np.arange(s, s + c, dtype=np.int64) for starts, counts in batches for s, c in zip(starts, counts)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


@st.composite
def blocks(draw):
    shape = draw(st.lists(st.integers(1, 7), min_size=0, max_size=4))
    index = []
    for n in shape:
        if draw(st.booleans()):
            index.append(None)
        else:
            index.append(np.array(sorted(draw(st.sets(st.integers(0, n - 1), max_size=n))), np.int64))
    return shape, index


@settings(max_examples=300, deadline=None)
@given(block=blocks(), max_runs=st.integers(1, 9))
def test_runs_are_the_blocks_flat_indices_in_order(block, max_runs):
    shape, index = block
    batches = list(box_runs(shape, index, max_runs=max_runs))
    assert np.array_equal(expand(batches), flat_indices(shape, index))
    for starts, counts in batches:
        assert starts.dtype == counts.dtype == np.int64 and (counts > 0).all()
        assert len(starts) <= max(max_runs, max((len(ix) for ix in index if ix is not None), default=1))


def test_whole_dims_fold_into_one_run():
    assert [(s.tolist(), c.tolist()) for s, c in box_runs((4, 5), [np.array([1, 2]), None])] == [([5], [10])]
    assert [(s.tolist(), c.tolist()) for s, c in box_runs((4, 5), [None, np.array([2, 3])])] == \
        [([2, 7, 12, 17], [2, 2, 2, 2])]
    assert [(s.tolist(), c.tolist()) for s, c in box_runs((2, 3, 4), [None, np.array([0, 1, 2]), None])] == [([0], [24])]
    assert [(s.tolist(), c.tolist()) for s, c in box_runs((), [])] == [([0], [1])]
    assert list(box_runs((3, 4), [np.array([], np.int64), None])) == []


def test_a_thin_column_comes_in_bounded_batches():
    batches = list(box_runs((100_000, 64), [None, np.array([5])], max_runs=4096))
    assert len(batches) == 25 and all(len(s) <= 4096 for s, _ in batches)
    assert np.array_equal(np.concatenate([s for s, _ in batches]), np.arange(100_000) * 64 + 5)
