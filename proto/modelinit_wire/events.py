"""The stream of a model's files as the client writer consumes it, whatever the transport.

A gRPC stream's messages and the in-process engine's output are both turned into these events,
so one writer (temp file, SHA-256 check, atomic rename) serves both paths.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:  # typing only: collections.abc.Buffer from Python 3.12
    from typing_extensions import Buffer


@dataclass(frozen=True)
class Begin:
    index: int
    """Index into the plan's files."""
    name: str
    size: int
    """Bytes of the whole file."""
    offset: int = 0
    """First byte that follows (a resume offset)."""


@dataclass(frozen=True)
class Data:
    data: Buffer
    """The next bytes of the current file: ``bytes`` or any contiguous buffer (memoryview, numpy)."""
    checked: bool = False
    """They crossed the wire under a transit check the source verified on receipt (the running
    CRC32C of an Init stream): the writer need not hash them, and the producer's SHA-256 in the
    file's End stands for the file. False: the writer hashes them (when it hashes at all)."""


@dataclass(frozen=True)
class End:
    index: int
    sha256: str | None
    """Hex SHA-256 of the whole file, as the producer computed it; None in-process, where there is
    no transport between producer and writer and the writer's own hash is the check."""


Event = Union[Begin, Data, End]
