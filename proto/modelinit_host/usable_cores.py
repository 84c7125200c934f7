"""The cores this process may use: what the kernels size their threads by, the embedded job its
files in flight, and ``verify`` the files it reads at once (server and client both ask)."""
from __future__ import annotations

import math
import os
import pathlib

#: Where the CPU controller's files are (cgroup v2 ``cpu.max``; v1 ``cpu/cpu.cfs_quota_us``), the
#: container's own under a cgroup namespace (as Kubernetes runs containers).
CGROUP = pathlib.Path("/sys/fs/cgroup")


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by a cgroup CPU quota (a
    container's CPU limit), both of which ``os.cpu_count()`` ignores. At least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    quota = period = 0.0
    try:
        fields = (CGROUP / "cpu.max").read_text().split()
        if fields and fields[0] != "max":
            quota, period = float(fields[0]), float(fields[1])
    except (OSError, ValueError, IndexError):
        try:
            quota = float((CGROUP / "cpu" / "cpu.cfs_quota_us").read_text())
            period = float((CGROUP / "cpu" / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            pass
    if quota > 0 and period > 0:
        cores = min(cores, math.ceil(quota / period))
    return max(1, cores)
