"""Scale-out on Ray: ``parts`` Ray tasks write one checkpoint, as ``modelinit init --part K/N`` does
on N machines, under a real scheduler that retries a task whose worker dies.

    import modelinit.ray
    result = modelinit.ray.init_model("llama-3-8b", seed=42, out_dir="s3://bucket/llama", parts=8)

Each task writes part K of N (``Client.init_model(..., part=(K, N))``): its byte-balanced share of
the shards, each file appearing only once complete, its own record kept beside them. The part
that finds all N done writes the index, config.json and ``modelinit.json`` once (an exclusive
create), so the checkpoint is finalized exactly once whatever the order in which tasks end, and
a task Ray runs again after its worker died keeps the shards it had finished and writes the rest.
``out_dir`` must be a place every worker reaches: an object-store prefix, or a folder they all
mount.

The request is planned here first, so a bad spec fails once, in the caller, before any task
runs; an error a task raises (ModelInitError) is raised as it is, never retried (Ray retries a
task only when its worker is lost, ``max_retries`` times). ``ray`` is imported only here (the
``ray`` extra).
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Callable

import grpc

from .bucket import is_bucket_url
from .client import Client, InitResult
from .errors import ModelInitError, ModelInitWarning
from .parts import idle_note
from .request import model_spec


def init_model(spec: Any, *, parts: int, out_dir: str | os.PathLike, seed: int, policy: Any = None,
               dtype: str | None = None, max_shard_size: str | int | None = None, algorithm_version: int | None = None,
               architecture: str | None = None, server: str | None = None, overwrite: bool = False,
               fsync: bool = False, direct_io: bool = True, num_cpus: float = 1, max_retries: int = 3,
               resources: dict[str, float] | None = None, runtime_env: dict | None = None,
               address: str | None = None) -> InitResult:
    """Write the checkpoint ``Client.init_model`` writes (same keywords) with ``parts`` Ray tasks,
    one ``part=(K, parts)`` each; returns the complete checkpoint's :class:`~modelinit.InitResult`.

    ``server``: the tasks stream from these modelinit servers (``Client(server)``); None: each
    task generates embedded (the ``server`` extra on the workers). Ray options per task:
    ``num_cpus``, ``resources`` (custom resources, e.g. ``{"cpu_node": 1}``), ``max_retries``
    (runs again after a lost worker), ``runtime_env`` (Ray's: e.g. ``{"env_vars": {...}}`` for the
    store's settings and credentials on the workers). ``address``: the Ray cluster to join (None: as
    ``ray.init()`` does, the ``RAY_ADDRESS`` cluster or a new local one; a cluster this call
    started is shut down at its end)."""
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, f"parts: must be an integer >= 1, got {parts!r}")
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, f"max_retries: must be an integer >= 0, got {max_retries!r}")
    request = dict(seed=seed, policy=policy, dtype=dtype, max_shard_size=max_shard_size,
                   algorithm_version=algorithm_version, architecture=architecture)
    # Paths are the caller's: a config file is read here and handed to the tasks as the spec
    # message (a worker runs in another folder, maybe on another node), a local out_dir made absolute.
    spec = model_spec(spec)
    if not is_bucket_url(out_dir) and not os.fspath(out_dir).startswith("file://"):
        out_dir = os.path.abspath(os.fspath(out_dir))
    with (Client(server) if server else Client()) as client:
        plan = client.plan(spec, tensors=False, **request)  # a bad spec or option fails here, once, before any task
    note = idle_note(plan, parts)
    if note:  # the idle tasks would end at once, with no word
        warnings.warn(f"ray: {note}", ModelInitWarning, stacklevel=2)
    try:
        import ray
    except ImportError:
        raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION,
                             "modelinit.ray needs Ray: install modelinit with the 'ray' extra (from a clone: pip install -e '.[ray]'; "
                             "docs/install.md)") from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, log_to_driver=False)
    try:
        task = ray.remote(_write_part).options(num_cpus=num_cpus, max_retries=max_retries, retry_exceptions=False,
                                               resources=resources or {}, runtime_env=runtime_env,
                                               name="modelinit-part")
        write = dict(out_dir=str(out_dir), overwrite=overwrite, fsync=fsync, direct_io=direct_io)
        refs = [task.remote(spec, k, parts, server, request, write) for k in range(parts)]
        results = _gather(ray, refs)
    finally:
        if started:
            ray.shutdown()
    done = [r for r in results if r.complete]
    if done:
        return done[0]
    with (Client(server) if server else Client()) as client:  # every part ended before the others' records showed
        return client.finalize(out_dir)


def _write_part(spec: Any, k: int, parts: int, server: str | None, request: dict, write: dict) -> InitResult:
    """One Ray task: part ``k`` of ``parts``."""
    with (Client(server) if server else Client()) as client:
        return client.init_model(spec, part=(k, parts), **write, **request)


def _gather(ray: Any, refs: list) -> list[InitResult]:
    """The tasks' results, in order; the first task error raised as the ModelInitError it was, a
    worker lost more often than ``max_retries`` allows as ABORTED (the finished shards are kept)."""
    from ray.exceptions import RayTaskError, WorkerCrashedError

    pending: list = list(refs)
    results: dict[Any, InitResult] = {}
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        try:
            results[ready[0]] = ray.get(ready[0])
        except RayTaskError as e:
            _cancel(ray, pending)
            cause: Callable | BaseException | None = getattr(e, "cause", None)
            if isinstance(cause, ModelInitError):
                raise ModelInitError(cause.code, cause.details) from None
            raise ModelInitError(grpc.StatusCode.INTERNAL, f"a part's task failed: {cause or e}") from None
        except WorkerCrashedError:
            _cancel(ray, pending)
            raise ModelInitError(grpc.StatusCode.ABORTED,
                                 f"part {refs.index(ready[0])}'s worker died more often than max_retries allows; the shards "
                                 "written are kept: run the same call again") from None
    return [results[r] for r in refs]


def _cancel(ray: Any, pending: list) -> None:
    for ref in pending:
        ray.cancel(ref, force=False)
