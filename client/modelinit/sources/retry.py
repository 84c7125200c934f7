"""When a call to a server is tried again: :class:`RetryPolicy` (how long), :data:`RETRYABLE` (after
what), :func:`connect_failure` (a server never reached, or a TLS trust failure: never retried), and
:class:`Backoff`, the waits between tries."""
from __future__ import annotations

import logging
import random
import re
import time
from dataclasses import dataclass

import grpc

from ..errors import ModelInitError

log = logging.getLogger("modelinit.client")  # the client's log, whichever module writes it

#: Status codes after which a call is retried (and a stream resumed): the server went away or
#: could not be reached. Everything else is an answer and is raised.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE})


@dataclass(frozen=True)
class RetryPolicy:
    """How a remote client rides out a lost connection (a restarted or drained server)."""

    deadline: float = 120.0
    """Seconds to keep trying after a failure before giving up; progress (bytes received)
    starts the count again. 0 disables retries."""
    initial_backoff: float = 0.25
    """Seconds before the first retry."""
    max_backoff: float = 5.0
    """Longest wait between retries."""
    multiplier: float = 2.0
    """Growth of the wait after each failed try (each wait is jittered to 50-100%)."""

    def __post_init__(self) -> None:
        if self.deadline < 0:
            raise ValueError(f"deadline: must be >= 0 seconds, got {self.deadline!r}")
        if not 0 < self.initial_backoff <= self.max_backoff:
            raise ValueError(f"initial_backoff: must be > 0 and <= max_backoff, got {self.initial_backoff!r}")
        if self.multiplier < 1:
            raise ValueError(f"multiplier: must be >= 1, got {self.multiplier!r}")


def connect_failure(details: str) -> tuple[str, str] | None:
    """What kept an UNAVAILABLE call from reaching any server, from its details: ``("trust",
    reason)`` when the TLS handshake failed (an untrusted or misnamed certificate, a server that
    does not speak TLS: retrying cannot fix it), ``("connect", reason)`` when no connection was
    made (refused, unknown name, closed during setup); None for anything else (a server that
    went away mid-call, one that is stopping)."""
    d = details.lower()
    if "certificate_verify_failed" in d:
        m = re.search(r"CERTIFICATE_VERIFY_FAILED: ([^:]+)", details)
        why = f" ({m.group(1).strip()})" if m else ""
        return "trust", (f"TLS handshake failed: the server's certificate is not trusted{why}; pass the CA that signed it "
                         "with --tls-ca")
    if "hostname verification" in d or "not in peer certificate" in d:
        return "trust", ("TLS handshake failed: the server's certificate does not name this address; dial a name it "
                         "holds, or reissue the certificate with this one")
    if "wrong_version_number" in d:
        return "trust", "TLS handshake failed: the server does not speak TLS; drop --tls/--tls-ca or check --server"
    if "ssl_error_ssl" in d:  # a TLS protocol error, not a lost connection (SSL_ERROR_SYSCALL)
        m = re.search(r"OPENSSL_internal:([A-Z0-9_]+)", details)
        why = f" ({m.group(1)})" if m else ""
        return "trust", f"TLS handshake failed{why}; check --tls-ca, --tls-cert and --tls-key"
    if "errors resolving" in d or "dns resolution failed" in d or "name resolution" in d:
        return "connect", "the name does not resolve; check --server"
    if "failed to connect" not in d:
        return None
    if "connection refused" in d:
        return "connect", "connection refused; check --server (host:port) and that the server is running"
    if "socket closed" in d or "connection reset" in d:
        return "connect", ("the server closed the connection during setup (a TLS server dialled without --tls, or a "
                           "mutual-TLS server refusing this client's certificate?); check --server and the TLS flags")
    reason = details.rsplit(": ", 1)[-1].strip() or "failed to connect"
    return "connect", f"{reason}; check --server"


def give_up(error: ModelInitError, target: str | None, reached: bool) -> ModelInitError | None:
    """The error to raise at once instead of retrying ``error``: any answer but UNAVAILABLE, a
    TLS trust failure, or a connection failure to a ``target`` this client never ``reached``
    (a mistyped address is not going to come up); None: retry."""
    if error.code not in RETRYABLE:
        return error
    failure = connect_failure(error.details)
    if failure is None or (failure[0] == "connect" and reached):
        return None  # a server that answered before and is gone now: restarting, draining
    return ModelInitError(error.code, f"cannot reach {target or 'the server'}: {failure[1]}")


class Backoff:
    """Waits between tries until the policy's deadline, counted from the first failure since the
    last ``progress()``."""

    def __init__(self, policy: RetryPolicy) -> None:
        self._policy = policy
        self.progress()

    def progress(self) -> None:
        self._since: float | None = None
        self._wait = self._policy.initial_backoff

    def wait_or_raise(self, error: ModelInitError, target: str | None = None, reached: bool = True) -> None:
        """Sleep before the next try, or raise: an error that is no reason to retry (see
        :func:`give_up`; ``reached``: this client got an answer from ``target`` before), or any
        once the deadline has passed."""
        fatal = give_up(error, target, reached)
        if fatal is not None:
            raise fatal
        now = time.monotonic()
        if self._since is None:
            self._since = now
        left = self._since + self._policy.deadline - now
        if left <= 0:
            raise error
        pause = min(self._wait * random.uniform(0.5, 1.0), left)
        log.warning("%s; retrying in %.2fs (giving up in %.0fs)", error, pause, left)
        time.sleep(pause)
        self._wait = min(self._wait * self._policy.multiplier, self._policy.max_backoff)


#: gRPC target schemes whose address lists contain commas themselves (``ipv4:a:1,b:2``).
