"""Fan-out: one model's files fetched in parallel from several replicas.

The service is stateless and deterministic, so any replica can serve any file, from any byte.
Each file is one ``Init`` call for that file alone; ``parallel`` calls run at once, file ``i``
starting on replica ``i mod n``. A call that fails with a retryable status resumes the same file
from the byte it had reached, on the next replica, after a backoff; a replica is asked for the
plan's fingerprint before it serves its first file, so replicas running different versions
cannot mix their bytes. Every file is hashed as it arrives and checked against its server's
SHA-256 before it is renamed into place.
"""
from __future__ import annotations

import hashlib
import logging
import os
import pathlib
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Callable, Sequence

import grpc

from .client import FileResult, RetryPolicy, _Backoff, _metadata
from .direct_file import DirectFile
from .errors import ModelInitError
from .v1 import modelinit_pb2 as pb

log = logging.getLogger("modelinit.client")


class _Cancelled(Exception):
    """Another file failed: this one stops too."""


class Fetcher:
    """Fetch ``plan``'s files into ``out`` with up to ``parallel`` calls across ``stubs``."""

    def __init__(self, stubs: Sequence, targets: Sequence[str], request: pb.ModelRequest, plan: pb.PlanResponse, *,
                 parallel: int, retry: RetryPolicy, timeout: float | None, progress: Callable[[int | None], None],
                 fsync: bool, direct_io: bool) -> None:
        self._stubs, self._targets = list(stubs), list(targets)
        self._request, self._plan = request, plan
        self._parallel = parallel
        self._retry, self._timeout = retry, timeout
        self._progress, self._fsync, self._direct_io = progress, fsync, direct_io
        self._stop = threading.Event()
        self._checked: set[int] = set()  # replicas whose fingerprint matched
        self._lock = threading.Lock()
        self.served: dict[str, int] = {t: 0 for t in self._targets}
        """Files each replica finished (the last replica of a resumed file gets it)."""

    def run(self, out: pathlib.Path, names: Sequence[str]) -> list[FileResult]:
        results: dict[int, FileResult] = {}
        with ThreadPoolExecutor(self._parallel, thread_name_prefix="modelinit-fetch") as pool:
            futures = {pool.submit(self._fetch, i, out, names[i]): i for i in range(len(names))}
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f for f in done if f.exception() is not None]
            if failed:
                self._stop.set()  # the others stop at their next message; queued ones never start
                for f in futures:
                    f.cancel()
                wait(futures)
                errors = [f.exception() for f in futures if not f.cancelled() and f.exception() is not None]
                raise next((e for e in errors if not isinstance(e, _Cancelled)), errors[0])
            for f, i in futures.items():
                results[i] = f.result()
        return [results[i] for i in range(len(names))]

    def _check_replica(self, k: int) -> None:
        with self._lock:
            if k in self._checked:
                return
        plan = self._stubs[k].Plan(pb.PlanRequest(request=self._request), timeout=self._timeout, metadata=_metadata())
        if plan.fingerprint != self._plan.fingerprint:
            raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"replica {self._targets[k]} plans different weights (fingerprint {plan.fingerprint[:16]}, "
                                 f"expected {self._plan.fingerprint[:16]}): are all replicas the same version?")
        with self._lock:
            self._checked.add(k)

    def _fetch(self, index: int, out: pathlib.Path, name: str) -> FileResult:
        if self._stop.is_set():
            raise _Cancelled()
        expected = self._plan.files[index]
        tmp = out / f".{name}.partial"
        fh = DirectFile(tmp, self._direct_io)
        digest = hashlib.sha256()
        offset = 0
        k = index % len(self._stubs)
        backoff = _Backoff(self._retry)
        ok = False
        try:
            while True:
                call = None
                try:
                    self._check_replica(k)
                    init = pb.InitRequest(request=self._request, offset=offset)
                    init.files.append(index)
                    call = self._stubs[k].Init(init, timeout=self._timeout, metadata=_metadata())
                    for msg in call:
                        if self._stop.is_set():
                            call.cancel()
                            raise _Cancelled()
                        kind = msg.WhichOneof("event")
                        if kind == "data":
                            fh.write(msg.data)
                            digest.update(msg.data)
                            offset += len(msg.data)
                            backoff.progress()
                            self._progress(len(msg.data))
                        elif kind == "begin":
                            b = msg.begin
                            if b.index != index or b.name != name or b.offset != offset or b.size != expected.size:
                                raise ModelInitError(grpc.StatusCode.DATA_LOSS,
                                                     f"stream: asked for {name} from byte {offset}, got {b.name!r} (index {b.index}) from byte {b.offset}")
                        elif kind == "end":
                            size = fh.size
                            fh.close(self._fsync)
                            got = digest.hexdigest()
                            if size != expected.size or msg.end.sha256 != got:
                                raise ModelInitError(
                                    grpc.StatusCode.DATA_LOSS,
                                    f"{name}: received {size} bytes with SHA-256 {got}, "
                                    f"server {self._targets[k]} says {expected.size} bytes with {msg.end.sha256}",
                                )
                            os.replace(tmp, out / name)
                            ok = True
                            with self._lock:
                                self.served[self._targets[k]] += 1
                            return FileResult(name, size, got)
                    raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"stream: {name} ended at byte {offset} without its checksum")
                except grpc.RpcError as e:
                    error = ModelInitError.from_rpc(e)
                except ModelInitError as e:
                    if e.code != grpc.StatusCode.UNAVAILABLE:
                        raise
                    error = e
                if self._stop.is_set():
                    raise _Cancelled()
                backoff.wait_or_raise(error)
                k = (k + 1) % len(self._stubs)  # the next replica
                log.warning("resuming %s at byte %d on %s", name, offset, self._targets[k])
        finally:
            if not ok:
                fh.abort()
                tmp.unlink(missing_ok=True)
