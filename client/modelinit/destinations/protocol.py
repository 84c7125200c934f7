"""The Destination protocol: where ``init_model`` writes, behind one shape.

Two implement it: :class:`modelinit.destinations.folder.FolderWriter` (a local folder written by one process)
and :class:`modelinit.destinations.prefix.PrefixWriter` (an object-store prefix, or a local folder that
the ``--part K/N`` runs of one checkpoint share). ``Client`` chooses one in one place
(``modelinit.destinations.choose.open_destination``) and drives either the same way:

1. :meth:`~Destination.prepare` surveys what is there for this part of the plan: already complete
   (nothing to write), or the files an interrupted run finished, kept;
2. :meth:`~Destination.write` is the sink the source's events go through (one stream, or several
   at once through the fan-out), each file checked as it passes and recorded once in place;
3. :meth:`~Destination.finish` writes ``modelinit.json`` once every file is there (for parts,
   once every part's are; the small files, index and config.json, are handed to it: read by
   :func:`read_small_files` from a stream the driver opens), or says what is missing;
4. :meth:`~Destination.close` releases what the destination holds (a failed run that finished
   nothing leaves no record behind).

Nothing here knows a source: what flows in is :mod:`modelinit.handoff`'s (events, checked files).
"""
from __future__ import annotations

import pathlib
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Protocol

from modelinit_wire.events import Begin, Data
from modelinit_wire.v1 import modelinit_pb2 as pb

from ..handoff import Events, FileResult
from ..parts import Part, small_files
from ..stream import StreamCheck


@dataclass(frozen=True)
class Survey:
    """What :meth:`Destination.prepare` found."""

    complete: tuple[FileResult, ...] | None = None
    """Every file of the plan, when the destination already holds exactly these weights
    (fingerprint, sizes, SHA-256s checked): nothing to write. None otherwise."""
    kept: dict[int, FileResult] = field(default_factory=dict)
    """Plan index -> a file of this part an interrupted run finished (verified), not written again."""


class Finalized(NamedTuple):
    """What :meth:`Destination.finish` found."""

    files: list[FileResult] | None
    """The plan's files when the checkpoint is complete (``modelinit.json`` there); None otherwise."""
    missing_parts: list[int]
    """The parts (0-based) with a shard not there as their record says: not finished yet, or a
    file deleted or replaced since it was written."""
    missing_files: list[str]
    """The shards not there as recorded, in plan order."""


class Destination(Protocol):
    """A folder or a prefix that ``init_model`` writes one request (or one part of it) into."""

    where: "pathlib.Path | str"
    """What ``InitResult.path`` says: the local folder (a path), or the URL."""

    def prepare(self, plan: pb.PlanResponse, part: Part, overwrite: bool) -> Survey:
        """Survey the destination for ``part`` of ``plan`` and clear what must go (an earlier run's
        files of other weights; foreign files only with ``overwrite``, refused otherwise)."""
        ...

    def write(self, events: Events, plan: pb.PlanResponse, indices: list[int],
              progress: Callable[[int], None]) -> list[FileResult]:
        """The files ``indices`` (in that order) from ``events``, each checked and recorded once in
        place; closes ``events``. Safe to call from several threads at once (one stream each)."""
        ...

    def finish(self, plan: pb.PlanResponse, part: Part, small: list[tuple[FileResult, bytes]]) -> Finalized:
        """``modelinit.json`` once every file of the plan is there (``small``: the index and
        config.json, checked, for a destination that writes them at the end; empty otherwise)."""
        ...

    def close(self, failed: bool) -> None:
        """Release the destination (``failed``: the run raised; a record of nothing is removed)."""
        ...


def read_small_files(plan: pb.PlanResponse, events_of: Callable[[list[int]], Events]) -> list[tuple[FileResult, bytes]]:
    """The plan's files that are not shards (the index, config.json) whole in memory, each checked
    (order, size, SHA-256): what a part hands to :meth:`Destination.finish`. ``events_of(indices)``
    opens the stream of those files (indices into ``plan``, in that order): the driver's, e.g. a
    source's ``events`` for the request planned; this module calls no source."""
    indices = small_files(plan)
    events = events_of(indices)
    check = StreamCheck(plan, indices)
    out: list[tuple[FileResult, bytes]] = []
    buf = bytearray()
    try:
        for event in events:
            if isinstance(event, Begin):
                check.begin(event)
                buf = bytearray()
            elif isinstance(event, Data):
                check.data(event.data)
                check.sha256.update(event.data)
                buf += memoryview(event.data).cast("B")  # any buffer: the engine hands numpy arrays
            else:
                out.append((check.end(event), bytes(buf)))
    finally:
        events.close()
    check.finish()
    return out
