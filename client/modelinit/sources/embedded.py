"""The embedded (in-process) mode: the server's planner and producer as a :class:`~modelinit.sources.protocol.Source`.

One of the two modules of the client package that import ``modelinit_server`` (the other is
:mod:`modelinit.server_extra`), and only inside functions, so ``import modelinit`` never needs the
server extra (numpy, numba, torch): the import-linter contracts in pyproject.toml allow these
imports here and there and nowhere else.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

import grpc
from modelinit_wire.v1 import modelinit_pb2 as pb

from ..errors import ModelInitError
from ..handoff import Events, FileResult, Write
from .fanout import each_file
from .protocol import check_version


class EmbeddedSource:
    """The server's own planner, engine and file producer (``modelinit_server.service.embedded.EmbeddedService``),
    in-process, without the gRPC hop: the same bytes. ``device``: ``auto``, ``cpu``, ``cuda``,
    ``reference``. FAILED_PRECONDITION when the server extra is not installed."""

    in_process = True
    """The producer runs in this process: each End's SHA-256 is of the very buffers a writer writes,
    so the writer need not hash them again (every byte hashed once)."""
    last_served: dict[str, int] = {}
    """No servers: always empty."""

    def __init__(self, device: str = "auto") -> None:
        try:
            from modelinit_server.service.embedded import EmbeddedService
        except ImportError as e:
            raise ModelInitError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"embedded mode needs the server extra ({e}); install modelinit with the 'server' extra (from a clone: "
                "pip install -e '.[server]'; docs/install.md) or pass a server target",
            ) from None
        try:
            self.service = EmbeddedService(device)
        except ValueError as e:
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        self._planned: tuple[pb.ModelRequest, Any] | None = None
        """The request :meth:`plan` was last given (the object itself), with the engine's plan of it."""

    def plan(self, request: pb.ModelRequest, page_size: int = 0, page_token: str = "") -> pb.PlanResponse:
        try:
            built = self._built(request)
            page = check_version(request, self.service.page(built, request, page_size, page_token))
        except ValueError as e:  # the same field-named message the server sends
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        self._planned = (request, built)  # the next page, and the stream, of this very request reuse it
        return page

    def _built(self, request: pb.ModelRequest) -> Any:
        planned = self._planned
        return planned[1] if planned is not None and planned[0] is request else self.service.build(request)

    def events(self, request: pb.ModelRequest, plan: pb.PlanResponse, files: Iterable[int] | None = None) -> Events:
        """The engine's events; each End carries the SHA-256 of the very buffers produced (see
        :attr:`in_process`). The request :meth:`plan` was just given is not planned again."""
        try:
            built = self._built(request)
            if built.fingerprint != plan.fingerprint:
                raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION,
                                     f"plan: fingerprint {plan.fingerprint[:16]} is not this request's ({built.fingerprint[:16]})")
            return self.service.events(built, files)
        except ValueError as e:  # e.g. the requested device's engine is unavailable
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None

    def stream_files(self, request: pb.ModelRequest, plan: pb.PlanResponse, files: list[int], write: Write,
                     parallel: int | None, progress: Callable[[int], None]) -> list[FileResult]:
        """``files`` through ``write``: one stream, or ``parallel`` files each with its own producer
        and SHA-256 (None: :meth:`files_at_once`, at most one per shard)."""
        if parallel is None:
            shards = sum(plan.files[i].shard for i in files)
            parallel = min(self.files_at_once(request, files), shards) if shards > 1 else 1
        if parallel > 1 and len(files) > 1:
            return each_file(lambda i: self.events(request, plan, [i]), files, write, parallel, progress)
        everything = files == list(range(len(plan.files)))
        return write(self.events(request, plan, None if everything else files), files, progress)

    def files_at_once(self, request: pb.ModelRequest | None = None, files: list[int] | None = None) -> int:
        """Files to produce at once by default on this machine (the engine's choice: several only
        where the generation outruns one file's SHA-256, on GPU nodes and many cores), for ``files``
        of ``request`` (None: any job)."""
        try:
            if request is None:
                return self.service.files_at_once()
            return self.service.files_at_once(self._built(request).elements(files))
        except ValueError as e:  # the requested device's engine is unavailable
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None

    def tensors(self, request: pb.TensorsRequest) -> Iterator[pb.TensorsResponse]:
        """The engine's Tensors stream (the server's own code, in-process)."""
        try:
            stream = self.service.tensors(request)
        except IndexError as e:  # a resume point past the end (slices.OutOfRange), as the server says it
            raise ModelInitError(grpc.StatusCode.OUT_OF_RANGE, str(e)) from None
        except ValueError as e:  # the same field-named message the server sends
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        return stream

    def close(self) -> None:
        pass
