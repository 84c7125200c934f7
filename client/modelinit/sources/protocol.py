"""The one seam between the client and whatever makes the weights: a :class:`Source`.

A source plans a request (one page at a time, as the ``Plan`` RPC), streams a plan's files as
:mod:`modelinit_wire.events`, and streams chosen tensors or slices of them (``Tensors``). Two implement it: :class:`modelinit.sources.embedded.EmbeddedSource` (the embedded
engine, in-process) and :class:`modelinit.sources.remote.RemoteSource` (gRPC stubs over one or more
replicas: retries, replica fingerprint checks, resumed streams). ``Client`` and ``verify`` use
sources only through this protocol and the functions here (:func:`full_plan`, :func:`check_version`).
What a source hands a destination (the stream, the sink's type, a checked file) is
:mod:`modelinit.handoff`'s, which neither side owns.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator, Protocol, runtime_checkable

import grpc
from modelinit_wire.v1 import modelinit_pb2 as pb

from ..errors import ModelInitError
from ..handoff import Events, FileResult, Write

#: Tensors per Plan page when a caller wants them all (the server allows up to 10,000; 5,000
#: TensorPlans are ~1 MB).
PLAN_PAGE_SIZE = 5000


@runtime_checkable
class Source(Protocol):
    """What plans a request and streams a plan's files. Errors are ModelInitError (a bad
    request: INVALID_ARGUMENT naming the field, as the server's)."""

    in_process: bool
    """True when the producer runs in this process: each End's SHA-256 is of the very buffers a
    writer writes, which then records it instead of hashing them again."""
    last_served: dict[str, int]
    """How many files each server finished in the last :meth:`stream_files` (empty in-process)."""

    def plan(self, request: pb.ModelRequest, page_size: int = 0, page_token: str = "") -> pb.PlanResponse:
        """One page of the plan (``page_size`` tensors from ``page_token`` on; 0: a summary, no
        tensors), refused unless it is of the requested algorithm version (see :func:`check_version`)."""
        ...

    def events(self, request: pb.ModelRequest, plan: pb.PlanResponse, files: Iterable[int] | None = None) -> Events:
        """Every file of ``plan`` (or those of ``files``, indices into its files, in that order),
        as one stream of events."""
        ...

    def stream_files(self, request: pb.ModelRequest, plan: pb.PlanResponse, files: list[int], write: Write,
                     parallel: int | None, progress: Callable[[int], None]) -> list[FileResult]:
        """``files`` (indices into ``plan``, in that order in the result) through ``write`` (a
        destination's sink), as one stream or ``parallel`` at once (None: the source's choice for
        this machine), each file checked by the sink."""
        ...

    def tensors(self, request: pb.TensorsRequest) -> Iterator[pb.TensorsResponse | memoryview]:
        """The ``Tensors`` stream of ``request``: per selection a TensorBegin, then its bytes; a
        data message may come as its payload alone, a ``memoryview`` (:mod:`modelinit.sources.stub`)."""
        ...

    def close(self) -> None: ...


def check_version(request: pb.ModelRequest, plan: pb.PlanResponse) -> pb.PlanResponse:
    """A server older than the requested algorithm version ignores the field: refuse its plan."""
    if request.algorithm_version and plan.algorithm_version != request.algorithm_version:
        raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION,
                             f"algorithm_version: asked for version {request.algorithm_version}, the server plans version "
                             f"{plan.algorithm_version} (it predates version {request.algorithm_version}; upgrade it)")
    return plan


def full_plan(source: Source, request: pb.ModelRequest, tensors: bool = False) -> pb.PlanResponse:
    """The summary (no tensors listed), or with ``tensors`` every page merged into one response
    (``next_page_token`` empty)."""
    if not tensors:
        return source.plan(request)
    plan = source.plan(request, PLAN_PAGE_SIZE)
    if not plan.tensor_count and plan.tensors:  # a server from before paging lists them all
        return plan
    token = plan.next_page_token
    while token:
        page = source.plan(request, PLAN_PAGE_SIZE, token)
        if page.fingerprint != plan.fingerprint or page.tensor_count != plan.tensor_count:
            raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"plan: a page came from a server planning other weights (fingerprint "
                                 f"{page.fingerprint[:16]}, expected {plan.fingerprint[:16]}): are all replicas the same version?")
        if not page.tensors or len(plan.tensors) + len(page.tensors) > plan.tensor_count:
            break  # reported below
        plan.tensors.extend(page.tensors)
        token = page.next_page_token
    if len(plan.tensors) != plan.tensor_count:
        raise ModelInitError(grpc.StatusCode.DATA_LOSS,
                             f"plan: the server's pages do not add up to its tensor_count {plan.tensor_count} "
                             f"(stopped after {len(plan.tensors)} tensors)")
    plan.next_page_token = ""
    return plan
