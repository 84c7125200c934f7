"""Whether this machine may have a CUDA device, asked of the driver itself: no torch, no triton
(importing them costs a CLI start most of a second on a machine that has no GPU at all)."""
from __future__ import annotations

import ctypes
import sys


def may_have_gpu() -> bool:
    """False only when the CUDA driver says there is no device: no libcuda, or cuInit /
    cuDeviceGetCount report none. Anything unexpected answers True and leaves the decision to torch."""
    if not sys.platform.startswith("linux"):
        return True
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    try:
        count = ctypes.c_int(0)
        if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return False
        return count.value > 0
    except Exception:  # pragma: no cover - an unusual driver library
        return True
