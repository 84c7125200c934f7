"""Writing boxes of stored tensors into (local shards of) module tensors.

A stored tensor (what the files hold) and a module tensor (what the model holds in memory) need
not be the same: transformers fuses some (MoE experts) and splits others (a fused qkv), and a
rank holds a shard. A :data:`Box` says where a block of one sits in the other, a :data:`Piece`
which stored tensor it is; :class:`Filler` generates exactly the elements of a box that a local
shard holds, as runs of consecutive global flat indices, straight into the local tensor when
its layout allows, else into a buffer that is scattered once.

Imports the engine (dtypes, runs, the kernel for the tensor's device) and core.tensors.
"""
from __future__ import annotations

import numpy as np

from ..core.tensors import TensorSpec
from ..engine import DTYPE_ITEMSIZE
from ..engine.backends import TensorFillRuns, tensor_fill_runs
from ..engine.runs import box_runs

#: Where a stored tensor's elements sit in an in-memory tensor: a box of one in the other.
#: (start per in-memory dim, in-memory dim of each disk dim or -1 for a unit one, start per disk
#: dim, length per disk dim). A start may be an index array instead of an int: the in-memory
#: indices, in disk order, that the box's elements along the disk dim mapped there go to (a
#: permutation of rows, as a stack's RoPE layout or fused, head-grouped projection makes).
Box = tuple[tuple["int | np.ndarray", ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]
#: (index into spec.tensors, *Box)
Piece = tuple[int, tuple["int | np.ndarray", ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]


class Filler:
    """Writes pieces of stored tensors into (local shards of) module tensors. ``device``: the
    kernel for tensors in CPU memory (``auto``, ``cpu``, ``reference``); each device's kernel is
    chosen on its first use (:func:`~modelinit_server.engine.backends.tensor_fill_runs`)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._fills: dict[str, TensorFillRuns] = {}

    def _gen_runs(self, flat_u8, sampler, key, starts, counts, dtype: str) -> None:
        """The runs' elements, back to back, into ``flat_u8`` (a contiguous 1-D uint8 torch tensor)."""
        kind = flat_u8.device.type
        fill = self._fills.get(kind)
        if fill is None:
            fill = tensor_fill_runs(kind, self.device)
            if fill is None:
                raise ValueError(f"module: tensors on {kind} are not supported (cpu, cuda)")
            self._fills[kind] = fill
        fill(flat_u8, sampler, key, starts, counts, dtype)

    def fill_piece(self, local, sets, tspec: TensorSpec, sampler, key, dtype: str, start: tuple[int, ...],
                   disk_to_src: tuple[int, ...], disk_start: tuple[int, ...] | None = None,
                   length: tuple[int, ...] | None = None) -> None:
        """Fill the box of stored tensor ``tspec`` that starts at ``disk_start`` and is ``length``
        long per disk dim (default: all of it) where it sits in the module tensor: from ``start``
        per module dim, disk dim ``k`` running along module dim ``disk_to_src[k]`` (-1: a unit
        dim). ``local`` holds the global indices ``sets`` of the module tensor."""
        import torch

        disk_shape = tspec.shape
        disk_start = disk_start or (0,) * len(disk_shape)
        length = length or tuple(disk_shape)
        if any(isinstance(s, np.ndarray) for s in start):
            self._fill_indexed(local, sets, disk_shape, sampler, key, dtype, start, disk_to_src, disk_start, length)
            return
        ndim = local.dim()
        # per module dim: the box, the global indices held, the local positions of those in the box
        ext = [1] * ndim
        for k, d in enumerate(disk_to_src):
            if d >= 0:
                ext[d] = length[k]
        pos: list[np.ndarray | None] = []  # None: every local position (the dim is whole and inside the box)
        rel: list[np.ndarray | None] = []  # box-relative indices (None: the whole box)
        for d in range(ndim):
            s = sets[d]
            b0, n = start[d], ext[d]
            full_dim = local.shape[d]
            if s is None:
                if b0 == 0 and n == full_dim:
                    pos.append(None)
                    rel.append(None)
                else:
                    pos.append(np.arange(b0, b0 + n))
                    rel.append(None)
                continue
            mask = (s >= b0) & (s < b0 + n)
            p = np.nonzero(mask)[0]
            if p.size == 0:
                return
            r = s[p] - b0
            pos.append(None if p.size == full_dim else p)
            rel.append(None if (r.size == n) else r)  # sorted and unique, so n of them: all
        # index sets in disk order
        krel = []
        for k, d in enumerate(disk_to_src):
            if d < 0:
                krel.append(np.array([disk_start[k]], dtype=np.int64))
            elif rel[d] is None:
                whole = disk_start[k] == 0 and length[k] == disk_shape[k]
                krel.append(None if whole else np.arange(disk_start[k], disk_start[k] + length[k], dtype=np.int64))
            else:
                krel.append(rel[d] + disk_start[k])
        sizes = [1 if d < 0 else (length[k] if rel[d] is None else len(rel[d])) for k, d in enumerate(disk_to_src)]
        identity = tuple(disk_to_src) == tuple(range(ndim)) and len(disk_shape) == ndim
        direct = identity and all(p is None for p in pos) and local.is_contiguous()
        if direct:
            buf = local
        else:
            buf = torch.empty(sizes, dtype=local.dtype, device=local.device)
        flat = buf.reshape(-1).view(torch.uint8)
        self._runs(flat, disk_shape, krel, sampler, key, dtype)
        if direct:
            return
        vals = _in_module_order(buf, sizes, disk_to_src, ndim)
        if all(p is None or _is_range(p) for p in pos):
            index = tuple(slice(None) if p is None else slice(int(p[0]), int(p[-1]) + 1) for p in pos)
            local[index] = vals
        else:
            index = tuple(
                (torch.arange(local.shape[d]) if p is None else torch.from_numpy(p)).to(local.device).view(
                    [-1 if j == d else 1 for j in range(ndim)])
                for d, p in enumerate(pos)
            )
            local[index] = vals

    def _fill_indexed(self, local, sets, disk_shape, sampler, key, dtype: str, start, disk_to_src: tuple[int, ...],
                      disk_start: tuple[int, ...], length: tuple[int, ...]) -> None:
        """:meth:`fill_piece` of a box whose starts include index arrays: the elements the local
        shard holds are generated in disk order and scattered to their in-memory places."""
        import torch

        ndim = local.dim()
        k_of = {d: k for k, d in enumerate(disk_to_src) if d >= 0}
        pos: list[np.ndarray] = []  # per module dim: local positions written
        rel: list[np.ndarray] = []  # per module dim: the box-relative (disk-order) indices of those
        for d in range(ndim):
            s = start[d]
            if d in k_of:
                want = np.asarray(s, np.int64) if isinstance(s, np.ndarray) else np.arange(s, s + length[k_of[d]], dtype=np.int64)
            else:
                want = np.array([int(s)], np.int64)
            held = sets[d]
            if held is None:
                r, p = np.arange(want.size, dtype=np.int64), want
            else:
                i = np.searchsorted(held, want)
                ok = (i < len(held)) & (held[np.minimum(i, len(held) - 1)] == want)
                r, p = np.nonzero(ok)[0], i[ok]
            if r.size == 0:
                return
            pos.append(p)
            rel.append(r)
        krel = [np.array([disk_start[k]], np.int64) if d < 0 else rel[d] + disk_start[k] for k, d in enumerate(disk_to_src)]
        sizes = [len(x) for x in krel]
        buf = torch.empty(sizes, dtype=local.dtype, device=local.device)
        self._runs(buf.reshape(-1).view(torch.uint8), disk_shape, krel, sampler, key, dtype)
        index = tuple(torch.from_numpy(p).to(local.device).view([-1 if j == d else 1 for j in range(ndim)])
                      for d, p in enumerate(pos))
        local[index] = _in_module_order(buf, sizes, disk_to_src, ndim)

    def _runs(self, flat_u8, disk_shape, krel, sampler, key, dtype: str) -> None:
        """Generate the product of ``krel`` (per disk dim: indices, None for all) in row-major
        order into ``flat_u8``, a batch of runs of consecutive flat indices at a time."""
        item = DTYPE_ITEMSIZE[dtype]
        pos = 0
        for starts, counts in box_runs(disk_shape, krel):
            n = int(counts.sum()) * item
            self._gen_runs(flat_u8[pos:pos + n], sampler, key, starts, counts, dtype)
            pos += n


def _in_module_order(buf, sizes: list[int], disk_to_src: tuple[int, ...], ndim: int):
    """Generated values (``sizes`` per disk dim, disk order) as the module tensor's dims hold them:
    unit disk dims dropped, the others permuted into module order, the module's unit dims added."""
    mapped = [(d, k) for k, d in enumerate(disk_to_src) if d >= 0]
    vals = buf.reshape([sizes[k] for _, k in mapped]) if mapped else buf.reshape([])
    if mapped:
        vals = vals.permute(sorted(range(len(mapped)), key=lambda i: mapped[i][0]))
    shape = [1] * ndim
    for d, k in mapped:
        shape[d] = sizes[k]
    return vals.reshape(shape)


def _is_range(p: np.ndarray) -> bool:
    return p.size > 0 and int(p[-1]) - int(p[0]) + 1 == p.size

