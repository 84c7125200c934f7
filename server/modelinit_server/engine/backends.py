"""Where the bytes are computed: the numpy reference, the numba CPU kernel or the Triton CUDA kernel.

Every backend writes exactly the reference's bytes (tests assert it); they differ only in speed.
numba, torch and triton are imported only when their backend is selected.

Two entries pick the kernel: :func:`select` for the service (host buffers that become files and
messages) and :func:`tensor_fill_runs` for training (a torch tensor's own memory, on its device);
both choose the kernel for host memory the same way.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from modelinit_wire import releases
from modelinit_wire.constants import DEVICES

from . import gpu_driver
from .host_values import Computed
from .reference import DTYPE_ITEMSIZE, check_runs, generate_array
from .sampler import Sampler

log = logging.getLogger("modelinit.engine")

#: fill(out, sampler, key, start, count, dtype): write the bytes of elements [start, start+count)
#: into ``out``, a contiguous uint8 numpy array of exactly count * itemsize bytes.
Fill = Callable[[np.ndarray, Sampler, tuple[int, int], int, int, str], None]
#: fill_beside(out, sampler, key, start, count, dtype, leave): ``fill`` leaving ``leave`` cores to other
#: work running beside it (SHA-256 threads).
FillBeside = Callable[[np.ndarray, Sampler, tuple[int, int], int, int, str, int], None]
#: fill_runs(out, sampler, key, starts, counts, dtype): the bytes of elements [starts[r], starts[r] +
#: counts[r]) of every run r, back to back in ``out`` (sum(counts) * itemsize bytes).
FillRuns = Callable[[np.ndarray, Sampler, tuple[int, int], np.ndarray, np.ndarray, str], None]
#: The same into torch memory: ``out`` a contiguous 1-D uint8 torch tensor on the device the
#: function was chosen for (:func:`tensor_fill_runs`).
TensorFillRuns = Callable[[Any, Sampler, tuple[int, int], np.ndarray, np.ndarray, str], None]


def _computing(fill):
    """``fill`` (or a ``fill_beside``) that copies a :class:`~.host_values.Computed` tensor's host values
    instead of generating."""

    def fill_or_copy(out: np.ndarray, sampler, key: tuple[int, int], start: int, count: int, dtype: str, *rest) -> None:
        if isinstance(sampler, Computed):
            sampler.fill(out, start, count, dtype)
        else:
            fill(out, sampler, key, start, count, dtype, *rest)

    return fill_or_copy


def _computing_runs(fill_runs: FillRuns) -> FillRuns:
    def fill_runs_or_copy(out: np.ndarray, sampler, key: tuple[int, int], starts, counts, dtype: str) -> None:
        if isinstance(sampler, Computed):
            sampler.fill_runs(out, starts, counts, dtype)
        else:
            fill_runs(out, sampler, key, starts, counts, dtype)

    return fill_runs_or_copy


@dataclass(frozen=True)
class Backend:
    name: str
    """``reference``, ``cpu`` (numba) or ``cuda`` (Triton)."""
    fill: Fill
    """Writes a range of a tensor's bytes into a host buffer."""
    parallel: bool
    """The fill uses every core itself: run one fill at a time (numba's default threading layer
    also refuses concurrent parallel calls)."""
    fill_runs: FillRuns
    """Writes many ranges of one tensor, back to back, into a host buffer (one parallel launch on the
    CPU kernel: a column block of a matrix is one short range per row)."""
    alloc: Callable[[int], np.ndarray] | None = None
    """Allocates the host segment buffers the fills write into (page-aligned uint8); CUDA gives
    page-locked (pinned) memory so device-to-host copies run at full DMA speed. None: plain memory."""
    fill_beside: FillBeside | None = None
    """``fill`` leaving ``leave`` cores free (its last argument), for a caller that runs other CPU work
    beside it (SHA-256 threads): a parallel kernel that shares its cores with other busy threads waits
    at the end of every launch for its preempted workers. None: ``fill`` uses no host cores worth sparing."""

    def __post_init__(self) -> None:
        # every backend copies computed tensors' host values the same way
        object.__setattr__(self, "fill", _computing(self.fill))
        object.__setattr__(self, "fill_runs", _computing_runs(self.fill_runs))
        if self.fill_beside is not None:
            object.__setattr__(self, "fill_beside", _computing(self.fill_beside))


def _reference_fill(out: np.ndarray, sampler: Sampler, key: tuple[int, int], start: int, count: int, dtype: str) -> None:
    out[:] = generate_array(sampler, key, start, count, dtype).view(np.uint8)


def looped(fill: Fill) -> FillRuns:
    """``fill_runs`` as one ``fill`` per run."""

    def fill_runs(out: np.ndarray, sampler: Sampler, key: tuple[int, int], starts, counts, dtype: str) -> None:
        starts, counts = check_runs(starts, counts)
        item = DTYPE_ITEMSIZE[dtype]
        if out.nbytes != int(counts.sum()) * item:
            raise ValueError(f"out: must hold exactly sum(counts) * itemsize = {int(counts.sum()) * item} bytes, got {out.nbytes}")
        pos = 0
        for s, c in zip(starts.tolist(), counts.tolist()):
            fill(out[pos : pos + c * item], sampler, key, s, c, dtype)
            pos += c * item

    return fill_runs


REFERENCE = Backend("reference", _reference_fill, parallel=False, fill_runs=looped(_reference_fill))


def check_floors(device: str) -> None:
    """What :func:`select` refuses of ``device``'s kernel libraries below modelinit's floors, said
    before anything is built or written (an embedded client checks at its start): numpy; numba for
    ``auto``/``cpu``; torch and triton for ``cuda`` (``auto`` checks them once CUDA is found)."""
    _refuse_below("numpy", *(("numba",) if device in ("auto", "cpu") else ()),
                  *(("torch", "triton") if device == "cuda" else ()))


def _refuse_below(*names: str) -> None:
    """A kernel's library installed below modelinit's floor (``modelinit_wire.releases``): its bytes were
    never checked there, so it is refused in one line, before it generates anything."""
    low = releases.below(*names)
    if low is not None:
        raise ValueError(f"device: {low}")


def _cpu(warmup: bool) -> Backend | None:
    try:
        from . import cpu
    except ImportError:
        return None
    if not cpu.available():
        return None
    _refuse_below("numba")
    if warmup:
        cpu.warmup()

    def fill_beside(out: np.ndarray, sampler: Sampler, key: tuple[int, int], start: int, count: int, dtype: str,
                    leave: int) -> None:
        cpu.generate_into(out, sampler, key, start, count, dtype, threads=max(1, cpu.threads() - leave))

    return Backend("cpu", cpu.generate_into, parallel=True, fill_runs=cpu.generate_runs_into, fill_beside=fill_beside)


def _cuda(warmup: bool) -> Backend | None:
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0") and not gpu_driver.may_have_gpu():
        return None  # no device: decided before importing triton (a sixth of a second of every job's start)
    try:
        from . import cuda
    except ImportError:
        return None
    if not cuda.available() or cuda.interpreting():  # the interpreter is for tests, not serving
        return None
    _refuse_below("torch", "triton")
    import torch

    if warmup:
        cuda.warmup()

    def fill(out: np.ndarray, sampler: Sampler, key: tuple[int, int], start: int, count: int, dtype: str) -> None:
        # Generate on the device, then one device-to-host copy into the caller's (pinned) buffer.
        staging = torch.empty(out.nbytes, dtype=torch.uint8, device="cuda")
        cuda.generate_into(staging, sampler, key, start, count, dtype)
        torch.from_numpy(out).copy_(staging)

    def fill_runs(out: np.ndarray, sampler: Sampler, key: tuple[int, int], starts, counts, dtype: str) -> None:
        staging = torch.empty(out.nbytes, dtype=torch.uint8, device="cuda")
        cuda.generate_runs_into(staging, sampler, key, starts, counts, dtype)
        torch.from_numpy(out).copy_(staging)

    def alloc(n: int) -> np.ndarray:
        # Pinned, and page-aligned (cudaHostAlloc returns pages) for O_DIRECT writers too; the
        # numpy view keeps the tensor, hence the pinned block, alive.
        pinned = torch.empty(n + 4096, dtype=torch.uint8, pin_memory=True).numpy()
        skip = -pinned.ctypes.data % 4096
        return pinned[skip : skip + n]

    return Backend("cuda", fill, parallel=True, fill_runs=fill_runs, alloc=alloc)


#: Under ``auto``, the elements an in-process job may have generated by the numpy reference, in all per
#: process, before a kernel is loaded (:class:`SmallJobs`): loading numba's four compiled kernels from
#: their cache takes about 0.6 s of a core, and the reference generates 4M float32 normal elements in
#: about 0.2 s (20 M/s on a 2-core Xeon; uniform and truncated normal are faster). Same bytes either way.
SMALL_JOB = 4_000_000


class SmallJobs:
    """Which ``auto`` jobs the reference takes instead of a kernel: those that fit in what is left of
    the process's :data:`SMALL_JOB` elements, while the CPU kernel's module is not imported. A tiny
    config's CLI call then loads no kernel (1.0 s to 0.4 s for ``modelinit init`` of a 200K-parameter
    model); a process that goes on generating (a census of hundreds of small models, a server) pays
    the reference's slower speed for at most :data:`SMALL_JOB` elements, about 0.2 s, once."""

    def __init__(self, budget: int = SMALL_JOB, kernel_loaded: Callable[[], bool] | None = None) -> None:
        self.left = budget
        self.kernel_loaded = kernel_loaded or (lambda: f"{__package__}.cpu" in sys.modules)
        """Whether the CPU kernel's module is imported in this process (then it is used)."""
        self._lock = threading.Lock()

    def take(self, device: str, elements: int, *, peek: bool = False) -> bool:
        """Whether a job of ``elements`` elements under ``device`` goes to the reference (``auto``
        only); unless ``peek``, its elements are then counted against the budget."""
        if device != "auto" or self.kernel_loaded():
            return False
        with self._lock:
            if elements > self.left:
                return False
            if not peek:
                self.left -= elements
            return True


#: This process's small jobs.
SMALL_JOBS = SmallJobs()


def select(device: str, warmup: bool = False) -> Backend:
    """``auto``: CUDA when present, else the numba kernel, else the reference (with a warning).
    ``cpu`` / ``cuda``: that kernel or a ValueError saying what is missing. ``warmup`` compiles
    the kernels now (a server does, before it reports SERVING) rather than on first use."""
    if device not in DEVICES:
        raise ValueError(f"device: {device!r} is not one of {', '.join(DEVICES)}")
    _refuse_below("numpy")
    if device in ("auto", "cuda"):
        backend = _cuda(warmup)
        if backend is not None:
            return backend
        if device == "cuda":
            raise ValueError("device: CUDA is not available (needs a GPU, torch with CUDA and triton); use --device cpu")
    return _host(device, warmup)


def _host(device: str, warmup: bool) -> Backend:
    """The kernel for host memory: ``reference``; ``cpu``: numba or a ValueError; otherwise numba
    where it is installed, else the reference (with a warning)."""
    if device == "reference":
        return REFERENCE
    backend = _cpu(warmup)
    if backend is not None:
        return backend
    if device == "cpu":
        raise ValueError("device: the CPU kernel needs numba (the server extra: pip install -e '.[server]' from a clone, docs/install.md); or use --device reference")
    log.warning("numba is not installed: using the slow numpy reference engine")
    return REFERENCE


def tensor_fill_runs(device_type: str, device: str = "auto") -> TensorFillRuns | None:
    """``fill_runs`` into the memory of a torch tensor on ``device_type`` (its ``.device.type``),
    so that a module's tensor is written where it lives, with no copy through another device: in
    CPU memory the host kernel ``device`` names (``reference``, ``cpu``; anything else as ``auto``)
    writes through a numpy view of the tensor's storage; in CUDA memory the Triton kernel
    generates on the device. None for any other device type. Kernels are imported on this call."""
    if device_type == "cpu":
        fill_runs = _host(device if device in ("reference", "cpu") else "auto", warmup=False).fill_runs

        def fill(out, sampler: Sampler, key: tuple[int, int], starts, counts, dtype: str) -> None:
            fill_runs(out.numpy(), sampler, key, starts, counts, dtype)

        return fill
    if device_type == "cuda":
        from . import cuda

        def fill_cuda(out, sampler, key: tuple[int, int], starts, counts, dtype: str) -> None:
            if isinstance(sampler, Computed):  # host values, one copy to the device
                import torch

                host = np.empty(out.numel(), np.uint8)
                sampler.fill_runs(host, starts, counts, dtype)
                out.copy_(torch.from_numpy(host))
            else:
                cuda.generate_runs_into(out, sampler, key, starts, counts, dtype)

        return fill_cuda
    return None
