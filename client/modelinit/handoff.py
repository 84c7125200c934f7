"""What a source hands a destination, owned by neither: the stream of a plan's files
(:class:`Events`), the sink a destination offers a source (:data:`Write`), and a file checked
on its way (:class:`FileResult`, also an entry of a record's ``files``).

:mod:`modelinit.sources` produces these and :mod:`modelinit.destinations` consumes them; both
import this module and neither imports the other.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

from modelinit_wire.events import Event


@dataclass(frozen=True)
class FileResult:
    """A file of a model folder: name, size and SHA-256 (an entry of a record's ``files``)."""

    name: str
    size: int
    sha256: str


class Events(Protocol):
    """A stream of events; closing it stops the producer (a no-op after the last event)."""

    def __iter__(self) -> Iterator[Event]: ...

    def close(self) -> None: ...


#: Writes one stream's files (indices into the plan) and returns them checked: a destination's sink.
Write = Callable[[Events, list[int], Callable[[int], None]], list[FileResult]]
