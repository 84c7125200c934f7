"""The C heap of a streaming process (``modelinit_host.heap``): a stream's megabyte blocks are
reused, not mapped and page-faulted anew for every message."""
import os
import subprocess
import sys

import grpc
import pytest

import modelinit
from modelinit.v1 import modelinit_pb2 as pb
from modelinit.v1 import modelinit_pb2_grpc as pb_grpc

glibc_linux = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not (getattr(os, "confstr_names", {}).get("CS_GNU_LIBC_VERSION")
                                                 and os.confstr("CS_GNU_LIBC_VERSION")),
    reason="glibc's mallopt and /proc: Linux with glibc only")

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
STREAMED = 384 << 20


def _stream(target: str, nbytes: int) -> int:
    """Read ``nbytes`` of llama-2-7b's Init stream from ``target`` with a bare stub, then cancel."""
    req = modelinit.client.model_request("llama-2-7b", seed=0, dtype="bfloat16")
    got = 0
    with grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 16 << 20)]) as ch:
        call = pb_grpc.ModelInitStub(ch).Init(pb.InitRequest(request=req))
        for m in call:
            got += len(m.data)
            if got >= nbytes:
                call.cancel()
                break
    return got


@pytest.mark.slow
@glibc_linux
def test_a_new_servers_first_stream_does_not_fault_every_block(server_process):
    """Without the thresholds a new server mapped each message's 1 MiB blocks afresh until its
    first stream ended: ~4 page faults per streamed page with three copies of each chunk (2.15 M
    for tinyllama's 2.2 GB, whose first Init took 9.3 s against 5.8 s for the next), ~2 with the
    one copy left. Now a small fraction of one per page."""
    proc = server_process()
    before = proc.minor_faults()
    got = _stream(proc.target, STREAMED)
    faults = proc.minor_faults() - before
    pages = got // PAGE
    assert faults < pages // 4, f"{faults} page faults for {pages} pages streamed"


WHERE_A_BLOCK_COMES_FROM = """
import ctypes, os, sys
{setup}
malloc = ctypes.CDLL(None).malloc
malloc.restype = ctypes.c_void_p
malloc.argtypes = (ctypes.c_size_t,)
p = malloc(4 << 20)
heap = [line for line in open("/proc/self/maps") if line.rstrip().endswith("[heap]")]
lo, hi = (int(x, 16) for x in heap[0].split()[0].split("-")) if heap else (0, 0)
print(lo <= p < hi)
"""


def _from_the_heap(setup: str, **env: str) -> bool:
    """Whether a 4 MiB block comes from the heap (reused) rather than a mapping of its own, in a
    new process after ``setup``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", WHERE_A_BLOCK_COMES_FROM.format(setup=setup)], capture_output=True,
                         text=True, env={**clean, **env}, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()[-1] == "True"


@glibc_linux
def test_a_megabyte_block_comes_from_the_heap_once_taught():
    assert not _from_the_heap("")  # glibc's start: mapped
    assert _from_the_heap("from modelinit_host.heap import keep_large_blocks; assert keep_large_blocks()")
    assert _from_the_heap("from modelinit_host.heap import keep_large_blocks as k; assert k() and not k()")  # once


@glibc_linux
def test_the_environment_still_decides():
    """Nothing is configured: glibc's thresholds set in the environment (which end its adaptation) win."""
    assert not _from_the_heap("from modelinit_host.heap import keep_large_blocks; keep_large_blocks()",
                              MALLOC_MMAP_THRESHOLD_="131072")


@glibc_linux
def test_a_remote_client_keeps_megabyte_blocks_in_its_heap():
    """A client process, the CLI's or a library caller's, is new for a job: its whole stream was a
    first one (tinyllama through a server: ~600 k page faults, 5.6-5.9 s, against 21 k and 4.5 s)."""
    assert _from_the_heap("from modelinit.sources.remote import RemoteSource; RemoteSource('127.0.0.1:9')")
