"""What tests in every folder share: the repository's root, tiny configs of the built-in families,
a generous wait, gRPC calls and sleeps recorded, an output folder read whole, and `modelinit serve`
in a subprocess. Import absolutely (``from tests.support import TINY``); the fixtures are
registered in tests/conftest.py, the servers and data of one concern are this package's modules:

- ``s3_server``, ``azure_server``, ``stores``: real object stores on loopback (moto, Azurite)
- ``tls_certs``: throwaway certificates
- ``golden``: the golden vectors that freeze the algorithm versions
- ``hostile_server``: a server the client must not trust, and the fixture that starts any servicer
- ``medium_model``: a model too big to stream in one go, its uninterrupted run, a quick retry policy
- ``tensor_checks``: written tensors against the law they should follow
- ``generic_configs``, ``census``: tiny configs of many transformers families; the census
- ``deploy``: deploy/'s manifests and Dockerfiles read as Kubernetes, the kubelet and Docker would
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import re
import subprocess
import sys
import threading
import time

import grpc

#: The repository's root (this file is tests/support/__init__.py).
REPO = pathlib.Path(__file__).resolve().parents[2]

#: Tiny configs of every supported family: fast to generate, still every tensor kind and role.
TINY = {
    "bert": {"model_type": "bert", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 128, "max_position_embeddings": 128, "type_vocab_size": 2, "pad_token_id": 0},
    "roberta": {"model_type": "roberta", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "intermediate_size": 128, "max_position_embeddings": 130, "type_vocab_size": 1, "pad_token_id": 1,
                "bos_token_id": 0, "eos_token_id": 2},
    "gpt2": {"model_type": "gpt2", "vocab_size": 1000, "n_embd": 64, "n_layer": 3, "n_head": 4, "n_positions": 128},
    "llama": {"model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 160, "max_position_embeddings": 128, "tie_word_embeddings": False},
    "mistral": {"model_type": "mistral", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "intermediate_size": 160, "max_position_embeddings": 128, "tie_word_embeddings": False},
    "qwen2": {"model_type": "qwen2", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 160, "max_position_embeddings": 128, "tie_word_embeddings": True},
}


#: How long a test waits for something that should happen (a stream ending, memory freed, a
#: server stopping) before it fails. Only a guard against hanging forever: generous, so a loaded
#: 2-core CI machine never trips it. Speed is measured in benchmarks/, never asserted in tests.
WAIT = 60.0


def wait_until(predicate, timeout: float = WAIT, what: str = "the condition", interval: float = 0.02):
    """Poll ``predicate()`` until it is truthy and return its value; AssertionError naming ``what``
    after ``timeout`` seconds. The deadline only keeps a broken test from hanging: it is not what
    the test checks (keep it generous)."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= end:
            raise AssertionError(f"gave up after {timeout:g}s waiting for {what}")
        time.sleep(interval)


class RpcLog(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
             grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Records the method of every call made on the channels it intercepts (attempts, whatever
    their outcome): count tries instead of timing them."""

    def __init__(self) -> None:
        self.methods: list[str] = []
        self._lock = threading.Lock()

    def count(self, suffix: str = "") -> int:
        """Calls whose method ends with ``suffix`` (``"/Plan"``; all calls when empty)."""
        with self._lock:
            return sum(1 for m in self.methods if m.endswith(suffix))

    def _record(self, details) -> None:
        with self._lock:
            self.methods.append(details.method)

    def intercept_unary_unary(self, continuation, client_call_details, request):
        self._record(client_call_details)
        return continuation(client_call_details, request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        self._record(client_call_details)
        return continuation(client_call_details, request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        self._record(client_call_details)
        return continuation(client_call_details, request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        self._record(client_call_details)
        return continuation(client_call_details, request_iterator)


@contextlib.contextmanager
def recording_rpcs():
    """Every gRPC channel created inside the block (``grpc.insecure_channel`` /
    ``grpc.secure_channel``, as the client makes them) records its calls in the yielded
    :class:`RpcLog`; the channels keep recording after the block ends. Create the client inside."""
    log = RpcLog()
    originals = grpc.insecure_channel, grpc.secure_channel

    def insecure(*args, **kwargs):
        return grpc.intercept_channel(originals[0](*args, **kwargs), log)

    def secure(*args, **kwargs):
        return grpc.intercept_channel(originals[1](*args, **kwargs), log)

    grpc.insecure_channel, grpc.secure_channel = insecure, secure
    try:
        yield log
    finally:
        grpc.insecure_channel, grpc.secure_channel = originals


@contextlib.contextmanager
def recording_sleeps():
    """Records the seconds of every ``time.sleep`` made by this thread inside the block (and still
    sleeps them): a client's backoff pauses, summed or counted without reading a clock. Other
    threads (an in-process server's) sleep as usual, unrecorded."""
    pauses: list[float] = []
    real = time.sleep
    me = threading.get_ident()

    def sleep(seconds: float) -> None:
        if threading.get_ident() == me:
            pauses.append(seconds)
        real(seconds)

    time.sleep = sleep
    try:
        yield pauses
    finally:
        time.sleep = real


def read_folder(path: pathlib.Path) -> dict[str, bytes]:
    """Every file of an output folder (hidden temp files included, so leftovers show up)."""
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


class ServerProcess:
    """`modelinit serve` in a subprocess on a free loopback port."""

    def __init__(self, *extra: str) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "modelinit.cli", "serve", "--host", "127.0.0.1", "--port", "0", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        line = self.proc.stdout.readline()
        self.ready_line = line
        m = re.search(r":(\d+) ", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r} {self.proc.stderr.read()}")
        self.target = f"127.0.0.1:{m.group(1)}"

    def peak_rss_bytes(self) -> int:
        for line in pathlib.Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM")

    def minor_faults(self) -> int:
        """Page faults served without I/O so far (``/proc/PID/stat`` field 10): each first touch
        of a freshly mapped page."""
        stat = pathlib.Path(f"/proc/{self.proc.pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[7])

    def stop(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=WAIT)
        finally:
            self.proc.kill()
