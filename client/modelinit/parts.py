"""One checkpoint written by N workers: which shards part K of N writes.

The split is a function of the plan alone (file sizes and order), and the plan is a function of
the request, so every worker of an Indexed Job, a Slurm array or a Ray pool computes the same split
without talking to the others. Only shards are split; the small files (``*.index.json``,
``config.json``) and ``modelinit.json`` are written once, by whichever part finds every shard there
(:func:`modelinit.destinations.prefix.finalize`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import grpc

from .errors import ModelInitError

_PART = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
MAX_PARTS = 10_000
"""Most parts of one checkpoint (S3 and every store here allow far more objects; this only
catches a typo such as ``3/40000``)."""


@dataclass(frozen=True)
class Part:
    """Part ``index`` of ``count`` (0-based, as Kubernetes' ``JOB_COMPLETION_INDEX``)."""

    index: int
    """Which part, ``0 <= index < count``."""
    count: int
    """How many parts write the checkpoint, ``1 <= count <= MAX_PARTS``."""

    def __post_init__(self) -> None:
        for what, v in (("index", self.index), ("count", self.count)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, f"part: {what} must be an integer, got {v!r}")
        if not 1 <= self.count <= MAX_PARTS:
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"part: the number of parts must be in 1..{MAX_PARTS}, got {self.count}")
        if not 0 <= self.index < self.count:
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"part: {self.index}/{self.count}: K must be in 0..{self.count - 1} "
                                 "(0-based, as Kubernetes' JOB_COMPLETION_INDEX)")

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def whole(self) -> bool:
        """One part: the whole checkpoint."""
        return self.count == 1


WHOLE = Part(0, 1)


def parse_part(value: "str | tuple[int, int] | Part | None", field: str = "part") -> Part:
    """``"K/N"``, ``(K, N)`` or a :class:`Part` (None: the whole checkpoint). INVALID_ARGUMENT
    naming ``field`` for anything else."""
    if value is None:
        return WHOLE
    if isinstance(value, Part):
        return value
    if isinstance(value, str):
        m = _PART.match(value)
        if m is None:
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{field}: {value!r} is not K/N; write e.g. 0/4 for the first of four parts")
        k, n = int(m.group(1)), int(m.group(2))
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        k, n = value
    else:
        raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"{field}: give (K, N) or 'K/N', got {value!r}")
    try:
        return Part(k, n)
    except ModelInitError as e:
        raise ModelInitError(e.code, e.details.replace("part:", f"{field}:", 1)) from None


def split_shards(sizes: Sequence[int], shard: Sequence[bool], count: int) -> list[list[int]]:
    """The shards (indices into the plan's files) of each of ``count`` parts, each list in plan
    order: largest shard first to the part with the fewest bytes so far (ties: the lower part),
    so parts differ by at most one shard's size. Files that are not shards belong to no part."""
    loads = [0] * count
    parts: list[list[int]] = [[] for _ in range(count)]
    for i in sorted((i for i in range(len(sizes)) if shard[i]), key=lambda i: (-sizes[i], i)):
        k = min(range(count), key=lambda k: (loads[k], k))
        loads[k] += sizes[i]
        parts[k].append(i)
    return [sorted(p) for p in parts]


def part_files(plan, part: Part) -> list[int]:
    """The plan's file indices that ``part`` writes: all files for the whole checkpoint; its
    share of the shards otherwise."""
    if part.whole:
        return list(range(len(plan.files)))
    return split_shards([f.size for f in plan.files], [bool(f.shard) for f in plan.files], part.count)[part.index]


def small_files(plan) -> list[int]:
    """The plan's files that are not shards (index, config): written once, after every part."""
    return [i for i, f in enumerate(plan.files) if not f.shard]


def idle_note(plan, count: int) -> str | None:
    """One line when some of ``count`` parts have no shard of ``plan`` to write (:func:`idle_note_of`);
    None when every part has one. ``plan``: a PlanResponse."""
    return idle_note_of([f.size for f in plan.files if f.shard], count, plan.request.max_shard_size)


def idle_note_of(shard_sizes: Sequence[int], count: int, max_shard_size: "str | int | None") -> str | None:
    """One line when some of ``count`` parts get no shard of these (plan order) to write: they
    finish at once, and at most one of them writes the small files. It says how to give every part
    a share: fewer parts, or a smaller ``max_shard_size`` (the shard bytes / ``count`` as a starting
    point: shards are whole tensors). None when every part has a shard."""
    split = split_shards(list(shard_sizes), [True] * len(shard_sizes), count)
    idle = [k for k, p in enumerate(split) if not p]
    if not idle:
        return None
    shards, shard_bytes = len(shard_sizes), sum(shard_sizes)
    which = ", ".join(map(str, idle[:8])) + (" ..." if len(idle) > 8 else "")
    size = str(max_shard_size or "5GB")
    size = _decimal_size(int(size)) if size.isdigit() else size  # a plan's request holds it in bytes
    return (f"part(s) {which} of {count} have no shard to write: the plan has {shards} shard(s) at max_shard_size {size}; "
            f"for a shard each, use at most {shards} part(s), or a smaller --max-shard-size "
            f"(about {_decimal_size(shard_bytes // count)} for {count} shards of these {_decimal_size(shard_bytes)})")


def _decimal_size(n: int) -> str:
    """``n`` bytes rounded down to a whole number (10 or more) of a decimal unit, as
    --max-shard-size takes it: 165MB, 1660MB, 2950B; exact when it is one (5GB)."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if n >= 10 * scale:
            return f"{n // scale}{unit}"
    return f"{max(n, 1)}B"
