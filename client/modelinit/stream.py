"""The one checker of a file stream (``Begin``, ``Data``..., ``End`` per file), shared by the
writer (:func:`modelinit.destinations.folder.write_files`) and ``verify``'s regeneration.

It holds a stream to the plan: files begin in the order asked for, each under its planned name
and size from byte 0, none before the previous one ended; no byte comes outside a file or past
its planned size; each file ends with exactly its planned size and the SHA-256 the producer
computed (when it sent one), and the stream ends only after the last file. Every breach is a
ModelInitError(DATA_LOSS). The checker hashes nothing itself: :attr:`StreamCheck.sha256` is the
current file's hasher, fed by the caller (the writer on a second thread, while it writes) while
:attr:`StreamCheck.hashing` says so. A file whose bytes all came checked in transit
(``Data.checked``: each message's CRC32C verified by the source) is not hashed here: the
producer's SHA-256 stands for it, as for an in-process producer.
"""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Iterable

import grpc
from modelinit_wire.events import Begin, End
from modelinit_wire.v1 import modelinit_pb2 as pb

from .errors import ModelInitError
from .handoff import FileResult

if TYPE_CHECKING:  # typing only: collections.abc.Buffer from Python 3.12
    from typing_extensions import Buffer


class StreamCheck:
    """Checks one stream of ``plan``'s files ``indices`` (in that order; all of them by default).
    ``what`` starts the messages of order errors (``"stream"``, ``"regenerate"``)."""

    def __init__(self, plan: pb.PlanResponse, indices: Iterable[int] | None = None, what: str = "stream",
                 hashed: bool = True) -> None:
        self.plan = plan
        self.hashed = hashed
        """False: the caller feeds :attr:`sha256` nothing, and each End must carry the producer's SHA-256,
        which becomes the file's (an in-process producer hashed the very buffers written)."""
        self.indices = list(range(len(plan.files)) if indices is None else indices)
        self.what = what
        self.done: list[FileResult] = []
        """The files that ended, checked, in order."""
        self.index: int | None = None
        """Plan index of the file being received; None between files."""
        self.received = 0
        """Bytes of the current file so far."""
        self.sha256 = hashlib.sha256()
        """The current file's hasher: the caller feeds it every Data event's bytes while :attr:`hashing`."""
        self.checked: bool | None = None
        """Whether the current file's bytes came checked in transit (None before its first byte)."""

    @property
    def name(self) -> str | None:
        """The current file's name (None between files)."""
        return None if self.index is None else self.plan.files[self.index].name

    def begin(self, event: Begin) -> pb.FilePlan:
        """A file begins: the next one asked for, under its planned name and size, from byte 0."""
        expected = self.indices[len(self.done)] if len(self.done) < len(self.indices) else None
        if event.index != expected or event.name != self.plan.files[event.index].name or event.offset != 0 or self.index is not None:
            raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"{self.what}: unexpected file {event.name!r} (index {event.index})")
        planned = self.plan.files[event.index]
        if event.size != planned.size:
            raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"{self.what}: {event.name} begins as {event.size} bytes, "
                                                            f"the plan says {planned.size}")
        self.index, self.received, self.sha256, self.checked = event.index, 0, hashlib.sha256(), None
        return planned

    @property
    def hashing(self) -> bool:
        """Whether the caller feeds :attr:`sha256` the data just passed to :meth:`data`."""
        return self.hashed and not self.checked

    def data(self, data: Buffer, checked: bool = False) -> int:
        """The current file's next bytes (any contiguous buffer; ``checked``: verified in transit):
        their count. Refused outside a file, at the first byte past the file's planned size, and
        when a file's bytes come part checked, part not (its own hash would miss some)."""
        if self.index is None:
            raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"{self.what}: data before any file began")
        if self.checked is None:
            self.checked = checked
        elif self.checked != checked:
            raise ModelInitError(grpc.StatusCode.DATA_LOSS,
                                 f"{self.plan.files[self.index].name}: its bytes came part with a transit check, part "
                                 "without (a resumed stream on a server of another version); rerun: the file is fetched again")
        with memoryview(data) as view:
            n = view.nbytes
        planned = self.plan.files[self.index]
        if self.received + n > planned.size:
            raise ModelInitError(grpc.StatusCode.DATA_LOSS,
                                 f"{planned.name}: the server sent more than the {planned.size} bytes planned; refusing the rest")
        self.received += n
        return n

    def end(self, event: End) -> FileResult:
        """The current file ends: its planned size received, and the SHA-256 of what was fed to
        :attr:`sha256` equal to the producer's (when it sent one). The file, checked."""
        if self.index is None or event.index != self.index:
            raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"{self.what}: a file ended that never began")
        planned = self.plan.files[self.index]
        got = self.sha256.hexdigest() if self.hashed and not self.checked else event.sha256
        if got is None:
            raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"{planned.name}: the producer sent no SHA-256 to record")
        if self.received != planned.size or event.sha256 not in (None, got):
            raise ModelInitError(
                grpc.StatusCode.DATA_LOSS,
                f"{planned.name}: received {self.received} bytes with SHA-256 {got}, "
                f"server says {planned.size} bytes with {event.sha256}",
            )
        self.index = None
        self.done.append(FileResult(planned.name, self.received, got))
        return self.done[-1]

    def finish(self) -> list[FileResult]:
        """The stream is over: every file asked for ended. The files, in order."""
        if len(self.done) != len(self.indices):
            raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"{self.what}: ended after {len(self.done)} of {len(self.indices)} files")
        return self.done

