"""The one exception type of the client, and its one warning type."""
from __future__ import annotations

import grpc


class ModelInitError(Exception):
    """Any failure of a modelinit call: bad input, a server error, a broken stream.

    ``code`` is the gRPC status (INVALID_ARGUMENT for bad input, DATA_LOSS for a checksum
    mismatch, UNAVAILABLE when the server cannot be reached, ...); ``details`` is the message,
    which for bad input starts with the offending field (``dtype: unknown dtype ...``).
    """

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details

    def __reduce__(self):
        # pickled as its two fields (a Ray task's error reaches its caller as the error it was):
        # Exception's own reduce would call ModelInitError(message), which takes (code, details)
        return type(self), (self.code, self.details)

    @classmethod
    def from_rpc(cls, err: grpc.RpcError) -> "ModelInitError":
        code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
        details = err.details() if hasattr(err, "details") else str(err)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "")


class ModelInitWarning(UserWarning):
    """Something that worked but is likely not what was meant, e.g. a part of a ``--part K/N``
    or Ray run with no shard to write. The CLI prints each as one ``modelinit: note:`` line."""
