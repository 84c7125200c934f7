"""What Megatron's own ``sharded_state_dict()`` says of a rank's local tensors: for each, the
global tensor it is a piece of (the key; a decoder's layers stacked on a leading axis), that
tensor's per-layer shape, and the global indices the local tensor holds (the tensor-parallel
rank's rows or columns, the pipeline stage's layers, FSDP2's shard of them). It runs on the model
itself and only wraps views of its local tensors: no copy, no communication."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, NamedTuple

import numpy as np

from ..dtensor import is_dtensor, local_and_index_sets


class GlobalPlace(NamedTuple):
    """Where a local tensor sits in Megatron's global per-layer tensor."""

    key: str
    """Megatron's checkpoint key."""
    lead: tuple[int, ...]
    """The global tensor's prepended offsets (layer, expert)."""
    shape: tuple[int, ...]
    """The per-layer global shape."""
    held: list
    """The global indices the local tensor holds per dim (None: all of it)."""


def pieces_of(model) -> tuple[dict[int, list[Any]], dict[int, Any]]:
    """Megatron's ShardedTensors of the model, per local tensor (by identity): the tensor itself or,
    for a factory (``linear_fc1``), the views of it that its build function makes. A DTensor
    parameter (FSDP2) is seen through its stand-in (:func:`_unsharded_stand_ins`), returned too,
    by the DTensor's identity."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    try:
        with _unsharded_stand_ins(model) as stand_ins:
            state = model.sharded_state_dict()
    except Exception as e:  # noqa: BLE001 - Megatron's own error, said as ours with the fix
        raise ValueError(f"module: Megatron's sharded_state_dict() failed ({type(e).__name__}: {e}); modelinit reads "
                         "each parameter's global place from it: call init_module_ after initialize_model_parallel") from None
    out: dict[int, list[Any]] = {}

    def add(owner, sharded) -> None:
        out.setdefault(id(owner), []).append(sharded)

    for value in _leaves(state):
        if isinstance(value, ShardedTensorFactory):
            for built in _leaves(value.build_fn(value.key, value.data, value.replica_id, value.flattened_range)):
                if isinstance(built, ShardedTensor):
                    add(value.data, built)
        elif isinstance(value, ShardedTensor) and value.data is not None:
            add(value.data, value)
    return out, stand_ins


@contextlib.contextmanager
def _unsharded_stand_ins(model) -> Iterator[dict[int, Any]]:
    """While inside, each DTensor parameter of ``model`` (FSDP2's shard of Megatron's tensor-parallel
    local parameter) is replaced by a meta tensor of its whole shape, dtype and attributes: the
    parameter as Megatron holds it without FSDP2. Megatron's ``sharded_state_dict()`` then says
    where that whole local parameter sits, as for DDP, allocating nothing; on the DTensor itself
    it would shift the offsets by the data-parallel rank (even shards only) and gather a tensor
    smaller than the mesh (``full_tensor()``: a collective). The parameters are put back on exit.
    Yields DTensor's identity -> its stand-in."""
    import torch

    swapped: list[tuple[Any, str, Any]] = []
    stand_ins: dict[int, Any] = {}
    try:
        for m in model.modules():
            for leaf, p in list(m._parameters.items()):
                if p is None or not is_dtensor(p):
                    continue
                stand = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"), requires_grad=False)
                stand.__dict__.update(vars(p))  # Megatron's tensor_model_parallel, partition_dim, ...
                swapped.append((m, leaf, p))
                stand_ins[id(p)] = stand
                m._parameters[leaf] = stand
        yield stand_ins
    finally:
        for m, leaf, p in swapped:
            m._parameters[leaf] = p


def _leaves(tree):
    if isinstance(tree, dict):
        for v in tree.values():
            yield from _leaves(tree=v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from _leaves(v)
    else:
        yield tree


def global_place(name: str, t, sharded: list[Any]) -> GlobalPlace:
    """``t``'s key, the global tensor's prepended offsets (layer, ...), its per-layer shape, and the
    global indices ``t`` holds per dim (None: all of it), from its ShardedTensors. Each one is a
    block of ``t``'s rows (a factory's chunk) at its own offset."""
    keys = {s.key for s in sharded}
    if len(keys) > 1:
        sharded = _joined(name, t, sharded)
        keys = {s.key for s in sharded}
    if len(keys) != 1:
        raise ValueError(f"module: Megatron saves {name!r} as several tensors ({sorted(keys)}); this layout is not supported")
    lead = {tuple(s.global_offset[:s.prepend_axis_num]) for s in sharded}
    shapes = {tuple(s.global_shape[s.prepend_axis_num:]) for s in sharded}
    if len(lead) != 1 or len(shapes) != 1:
        raise ValueError(f"module: Megatron saves {name!r} in pieces of several layers; this layout is not supported")
    shape = shapes.pop()
    if any(s.flattened_range is not None for s in sharded):
        raise ValueError(f"module: Megatron saves {name!r} flattened (a distributed optimizer's shard); call init_module_ "
                         "on the model's parameters, not the optimizer's")
    if len(shape) != t.dim():
        raise ValueError(f"module: {name!r} is {list(t.shape)}, Megatron saves it as {list(shape)}")
    rows: list[tuple[int, np.ndarray]] = []  # (first local row, global rows) per piece
    other: list[np.ndarray | None] = [None] * t.dim()
    row_stride = t.stride(0) if t.dim() else 1
    for s in sharded:
        local = tuple(s.local_shape)
        offset = tuple(s.global_offset[s.prepend_axis_num:])
        at = s.data.storage_offset() - t.storage_offset()
        if s.data.untyped_storage().data_ptr() != t.untyped_storage().data_ptr() or at % max(row_stride, 1) \
                or tuple(s.data.shape) != local or local[1:] != tuple(t.shape[1:]):
            raise ValueError(f"module: Megatron's piece of {name!r} is not a block of its rows; this layout is not supported")
        rows.append((at // max(row_stride, 1), np.arange(offset[0], offset[0] + local[0], dtype=np.int64) if local else None))
        for d in range(1, t.dim()):
            held = np.arange(offset[d], offset[d] + local[d], dtype=np.int64)
            if other[d] is not None and not np.array_equal(other[d], held):
                raise ValueError(f"module: Megatron's pieces of {name!r} differ in dim {d}; this layout is not supported")
            other[d] = held
    sets: list[np.ndarray | None] = list(other)
    if t.dim():
        rows.sort(key=lambda r: r[0])
        held = np.concatenate([r[1] for r in rows])
        firsts = [r[0] for r in rows]
        if firsts != list(np.cumsum([0] + [len(r[1]) for r in rows[:-1]])) or held.size != t.shape[0] \
                or np.any(np.diff(held) <= 0):
            raise ValueError(f"module: Megatron's pieces of {name!r} do not tile it in order; this layout is not supported")
        sets[0] = held
    sets = [None if s is not None and s.size == n and s[0] == 0 and s[-1] == n - 1 else s
            for s, n in zip(sets, shape)]
    return GlobalPlace(keys.pop(), lead.pop(), shape, sets)


#: The parts Megatron saves a tensor as, in their order (Mamba's ``_split_tensor_factory``: a
#: ``MambaMixer``'s ``in_proj`` as [z, x, B, C, dt], its ``conv1d`` as [x, B, C]).
_PARTS = (("z", "x", "B", "C", "dt"), ("x", "B", "C"))


class _Part(NamedTuple):
    """A part's ShardedTensor, placed in the tensor its parts make together."""

    key: str
    global_offset: tuple[int, ...]
    global_shape: tuple[int, ...]
    local_shape: tuple[int, ...]
    prepend_axis_num: int
    flattened_range: Any
    data: Any


def _joined(name: str, t, sharded: list[Any]) -> list[Any]:
    """The pieces of a tensor Megatron saves as named parts (:data:`_PARTS`, each part a global tensor
    of its own, ``<key>.<part>``, and a block of ``t``'s rows), placed in the one tensor the parts make
    put together along dim 0 in their order: part ``p``'s global row ``r`` is that tensor's row
    ``r`` + the rows of the parts before it. A tensor-parallel rank holds its rows of every part
    ([z_r, x_r, B_r, C_r, dt_r]): its rows of the whole tensor are then not one block."""
    base = {s.key.rpartition(".")[0] for s in sharded}
    order = sorted({s.key.rpartition(".")[2]: s.data.storage_offset() for s in sharded}.items(), key=lambda kv: kv[1])
    parts = tuple(p for p, _ in order)
    if len(base) != 1 or parts not in _PARTS or any(s.flattened_range is not None or s.data.dim() != t.dim()
                                                    for s in sharded):
        return sharded  # refused by the caller, naming the keys
    rows = {}
    for s in sharded:
        rows.setdefault(s.key.rpartition(".")[2], s.global_shape[s.prepend_axis_num])
    before = dict(zip(parts, [sum(rows[p] for p in parts[:i]) for i in range(len(parts))]))
    total = sum(rows.values())
    key = base.pop()
    out = []
    for s in sharded:
        n, part = s.prepend_axis_num, s.key.rpartition(".")[2]
        offset = (*s.global_offset[:n], s.global_offset[n] + before[part], *s.global_offset[n + 1:])
        out.append(_Part(key, offset, (*s.global_shape[:n], total, *s.global_shape[n + 1:]), tuple(s.local_shape), n,
                         None, s.data))
    return out


def within(held: list, shape: tuple[int, ...], t, name: str) -> list:
    """The global indices a DTensor parameter's local shard holds per dim: FSDP2 (torch's
    ``fully_shard``, over the data-parallel group) shards Megatron's tensor-parallel local
    parameter (the DTensor's whole shape: Megatron's tensor parallel is not a DTensor), which
    holds ``held`` of the global tensor (None: all ``shape[d]``); the shard holds the elements its
    placements pick of those (:func:`~modelinit_server.training.dtensor.local_and_index_sets`: Shard(0), _StridedShard,
    Replicate, uneven sizes included)."""
    _, picked = local_and_index_sets(t, name)
    return [h if p is None else (np.arange(n, dtype=np.int64) if h is None else h)[p]
            for h, p, n in zip(held, picked, shape)]
