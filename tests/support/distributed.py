"""What the sharded-model tests share: their worlds of ranks (:func:`spawn`), the collectives a
filling rank must never call, refused while ``init_module_`` runs (:func:`no_collectives`), and the
byte comparison of tensors."""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Callable, Iterator


def spawn(fn: Callable[..., None], args: tuple = (), nprocs: int = 1) -> None:
    """``torch.multiprocessing.spawn(fn, args, nprocs, join=True)``, the ranks forked from a fork
    server that imported torch, transformers and the stacks once per test process
    (tests/support/rank_preload.py): each rank runs ``fn(rank, *args)`` in a process of its own, as
    under spawn, without paying those imports again (Megatron-Core alone is about 4 s).

    Each rank starts with this process's environment and ``sys.path`` as they are now (the fork
    server keeps those of its own start: a later ``PYTHONPATH``, as tests/support/stacks.py sets for
    torchtitan, would be missing), and one torch thread unless ``OMP_NUM_THREADS`` says otherwise
    (the ranks of a world share the machine's cores)."""
    import multiprocessing

    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    multiprocessing.set_forkserver_preload(["tests.support.rank_preload"])
    mp.start_processes(_rank, args=(fn, dict(os.environ), list(sys.path), args), nprocs=nprocs, join=True,
                       start_method="forkserver")


def _rank(rank: int, fn: Callable[..., None], environ: dict[str, str], path: list[str], args: tuple[Any, ...]) -> None:
    import torch

    os.environ.clear()
    os.environ.update(environ)
    sys.path[:] = path
    torch.set_num_threads(int(environ["OMP_NUM_THREADS"]))
    fn(rank, *args)


#: torch.distributed's communicating calls.
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
               "scatter", "barrier", "send", "recv", "all_to_all", "all_to_all_single")


@contextlib.contextmanager
def no_collectives() -> Iterator[None]:
    """While inside, any collective of torch.distributed raises (init_module_ must not communicate).

    Two nets: the public ``torch.distributed.*`` calls are replaced by one that raises at once, and
    torch's ``CommDebugMode`` (a dispatch mode) counts every collective op that runs, the
    functional ones DTensor itself issues (``torch.ops._c10d_functional``: ``full_tensor()``,
    redistributions) included, which no public name is called for; any count fails at the exit."""
    import torch.distributed as d
    from torch.distributed.tensor.debug import CommDebugMode

    saved = {n: getattr(d, n) for n in COLLECTIVES if hasattr(d, n)}

    def refuse(*args, **kwargs):
        raise AssertionError("init_module_ must not communicate")

    for n in saved:
        setattr(d, n, refuse)
    counted = CommDebugMode()
    try:
        with counted:
            yield
    finally:
        for n, f in saved.items():
            setattr(d, n, f)
    if counted.get_total_counts():
        calls = {str(op): k for op, k in counted.get_comm_counts().items()}
        raise AssertionError(f"init_module_ must not communicate; it ran the collectives {calls}")


def same_bytes(a, b) -> bool:
    """Same dtype, shape and bytes (NaN payloads included)."""
    import torch

    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def exit_rank() -> None:
    """End a spawned rank's process at once, its work done: ``os._exit(0)``, before the process
    group is destroyed and the interpreter torn down. Tearing down gloo and the kernels' thread
    pools at exit has, once in a while, aborted a rank ("terminate called without an active
    exception", SIGABRT) after every check had passed. A failing rank raises before it gets here,
    and ``mp.spawn`` reports that."""
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
