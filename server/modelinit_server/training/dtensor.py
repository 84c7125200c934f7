"""DTensors (FSDP2, tensor parallel, any mesh): the local shard to write into, and the global
indices it holds.

How a local shard's global elements are found: a DTensor's local tensor is always the Cartesian
product of one sorted list of global indices per tensor dimension (each placement shards one
dimension, and how it splits depends only on that dimension's size). Those lists are computed by
applying each placement's own split to an ``arange`` of the dimension, in mesh order, exactly as
torch's ``_StridedShard.local_shard_size_and_offset`` does: no communication.

Imports numpy (torch inside the functions); nothing of modelinit.
"""
from __future__ import annotations

import numpy as np


def _dtensor_class():
    try:
        from torch.distributed.tensor import DTensor
    except Exception:  # noqa: BLE001 - torch without distributed
        return None
    return DTensor


def is_dtensor(t) -> bool:
    DTensor = _dtensor_class()
    return DTensor is not None and isinstance(t, DTensor)


def local_tensor(t):
    """The tensor this rank holds: a DTensor's local shard, else ``t``."""
    return t._local_tensor if is_dtensor(t) else t


def local_and_index_sets(t, name: str):
    """The tensor to write into and, per dimension, the global indices it holds (None: all)."""
    if not is_dtensor(t):
        return t.data if hasattr(t, "data") else t, [None] * t.dim()
    local = t._local_tensor
    sets = dtensor_index_sets(t)
    want = tuple(len(s) if s is not None else n for s, n in zip(sets, t.shape))
    if tuple(local.shape) != want:
        raise ValueError(
            f"module: {name!r}: its local shard is {tuple(local.shape)} but its placements {tuple(t.placements)} "
            f"give {want}; this sharding is not supported"
        )
    return local, sets


def dtensor_index_sets(t) -> list[np.ndarray | None]:
    """Per dimension of DTensor ``t``, the sorted global indices its local shard holds (None: the
    whole dimension). Placements are applied in mesh order, each with its own split (torch's
    ``Shard``/``_StridedShard`` semantics, uneven sizes included), to an arange of the dimension:
    no communication."""
    import torch
    from torch.distributed.tensor.placement_types import Shard, _StridedShard

    mesh = t.device_mesh
    coord = mesh.get_coordinate()
    ndim = t.dim()
    sets: list[np.ndarray | None] = [None] * ndim
    if coord is None:  # not part of the mesh: holds nothing
        return [np.zeros(0, dtype=np.int64)] * ndim
    for i, p in enumerate(t.placements):
        if p.is_replicate():
            continue
        if not isinstance(p, (Shard, _StridedShard)):
            raise ValueError(f"module: placement {p} of a parameter is not supported (Shard, _StridedShard, Replicate)")
        d = p.dim % ndim
        cur = torch.arange(t.shape[d]) if sets[d] is None else torch.from_numpy(sets[d])
        parts, _ = p._split_tensor(cur.view([1] * d + [-1]), mesh.size(i), with_padding=False, contiguous=False)
        sets[d] = parts[coord[i]].reshape(-1).numpy().astype(np.int64, copy=True)
    return sets
