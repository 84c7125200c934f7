"""The SHA-256s of the shards this process has produced whole: a shard is never hashed twice.

A shard's bytes follow from its plan's fingerprint (everything the tensor data depends on: seed,
dtype, algorithm version, each tensor's name, shape and distribution) and its safetensors header
(which tensors it holds, in which order, at which offsets). Two requests with equal fingerprints
and headers therefore ask for equal bytes, on any engine, and the digest computed for the first
stands for the second. Knowing it saves a SHA-256 pass over every byte (about a core-second per
1.6 GB on a SHA-NI core, a quarter of a 2-core server's work for a bf16 model), and a stream
resumed at byte B of a known shard starts generating at B instead of regenerating bytes 0..B
for the hash.

What a remembered digest no longer does: check that the second generation equals the first (it
never could: a digest of the bytes generated is of whatever was generated). A client's manifest
then records the first generation's digest, so ``modelinit verify`` of a file whose bytes came out
differently reports it, where a fresh digest would have matched the wrong bytes.
"""
from __future__ import annotations

import collections
import hashlib
import threading

#: Shards remembered (least recently used dropped first): about 320 bytes each, 21 MB when full.
CAPACITY = 65536


class Digests:
    """Shard key -> SHA-256 hex, bounded (:data:`CAPACITY`), safe to share among streams on any thread."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity: must be >= 1, got {capacity!r}")
        self._capacity = capacity
        self._known: collections.OrderedDict[bytes, str] = collections.OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(fingerprint: str, algorithm_version: int, header: bytes) -> bytes:
        """What a shard's bytes follow from: its plan's fingerprint and algorithm version, and its header."""
        h = hashlib.sha256(f"{algorithm_version}:{fingerprint}:".encode())
        h.update(header)
        return h.digest()

    def get(self, key: bytes) -> str | None:
        with self._lock:
            sha = self._known.get(key)
            if sha is not None:
                self._known.move_to_end(key)
            return sha

    def put(self, key: bytes, sha256: str) -> None:
        with self._lock:
            self._known[key] = sha256
            self._known.move_to_end(key)
            while len(self._known) > self._capacity:
                self._known.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._known)
