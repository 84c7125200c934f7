"""The embedded default: the server's planner, engine and file producer, in-process.

``modelinit.Client()`` uses this instead of a loopback gRPC hop: the same code makes the same
bytes (a test compares them with a separately started server's), only faster.
"""
from __future__ import annotations

import threading
from typing import Iterator, Sequence

from modelinit_host.usable_cores import usable_cores
from modelinit_wire.events import Event
from modelinit_wire.v1 import modelinit_pb2 as pb

from ..core.planner import Plan
from ..engine.backends import DEVICES, Backend, check_floors, select
from ..messages import check_page_size, plan_to_pb
from ..produce import file_bytes, tensor_slices
from .plans import PlanCache


class EmbeddedService:
    """Plan and produce files in-process. Bad requests raise ValueError (field-named, as the server's)."""

    def __init__(self, device: str = "auto") -> None:
        if device not in DEVICES:
            raise ValueError(f"device: {device!r} is not one of {', '.join(DEVICES)}")
        check_floors(device)  # read from package metadata: nothing imported
        self.device = device
        self._backend: Backend | None = None
        self._lock = threading.Lock()  # a client's parallel files open their streams from several threads
        # the caller keeps the plan it streams; kept here: the last request's resolution, for its next seed
        self._plans = PlanCache(plans=0, resolutions=1)

    @property
    def backend(self) -> Backend:
        """Chosen on first use, so planning alone never imports numba, torch or triton."""
        with self._lock:
            if self._backend is None:
                self._backend = select(self.device)
            return self._backend

    def files_at_once(self) -> int:
        """How many files to produce at once when the caller does not say. Each file's SHA-256 is one
        serial stream on one core (~1-2 GB/s) beside its generation; where the generation outruns it
        (a GPU, many cores), several files in flight let the hashes use several cores, while on a
        small CPU machine they would only take cores from the generation. CUDA: half the usable cores
        (a hash and a writer thread per file); the CPU kernel: a quarter of its threads (one hash keeps
        pace with about three cores generating bfloat16); the reference engine: 1."""
        name = self.backend.name
        if name == "cuda":
            return max(1, usable_cores() // 2)
        if name == "cpu":
            from ..engine import cpu

            return max(1, min(cpu.threads(), usable_cores()) // 4)
        return 1

    def build(self, msg: pb.ModelRequest) -> Plan:
        """The plan of a request (ValueError, field-named, for a bad one). A caller that plans and
        then streams keeps it and hands it to :meth:`events`: planning happens once."""
        return self._plans.build(msg)

    def plan(self, msg: pb.ModelRequest, page_size: int = 0, page_token: str = "") -> pb.PlanResponse:
        """One page of the plan, as the server's Plan (0: a summary without tensors)."""
        return self.page(self.build(msg), msg, page_size, page_token)

    def page(self, plan: Plan, msg: pb.ModelRequest, page_size: int = 0, page_token: str = "") -> pb.PlanResponse:
        """One page of ``plan`` (built from ``msg``), as the server's Plan."""
        check_page_size(page_size)
        return plan_to_pb(plan, msg, page_size, page_token)

    def events(self, plan: Plan, selected: Sequence[int] | None = None) -> "file_bytes.Prefetch":
        """Every file's events of ``plan`` (or those of ``selected``, indices into its files, in that
        order), produced on a background thread a couple of segments ahead of the writer. Each End
        carries the file's SHA-256, hashed here beside the generation (the only hash of the bytes:
        the writer, in this process, writes the very buffers hashed). Close the returned iterator
        to stop early."""
        selected = range(len(plan.files)) if selected is None else list(selected)
        if any(not 0 <= i < len(plan.files) for i in selected):
            raise ValueError(f"files: an index is past the last file ({len(plan.files) - 1})")
        # Ring of 4: the writer holds one buffer, the queue two, the producer fills the fourth.
        source: Iterator[Event] = file_bytes.events(plan, selected, 0, self.backend.fill, ring=4, alloc=self.backend.alloc,
                                                fill_beside=self.backend.fill_beside)
        return file_bytes.Prefetch(source, depth=2)

    def tensors(self, request: pb.TensorsRequest) -> Iterator[pb.TensorsResponse]:
        """The Tensors stream of ``request``, as the server's: a TensorBegin per selection, then
        its bytes in chunks. ValueError (field-named) for a bad request, before anything is generated."""
        plan = self.build(request.request)
        tensor_slices.check_chunk(request.chunk_size)
        # checked now, not on the first next()
        tensor_slices.resume(tensor_slices.select(plan, request), request.start, request.offset, plan.request.dtype)
        return tensor_slices.responses(plan, request, self.backend.fill_runs)
