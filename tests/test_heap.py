"""The heap of the processes modelinit owns (``modelinit_wire.heap``): a stream's 1 MiB blocks
are reused, not mapped and page-faulted anew for every message."""
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


def _run(code: str, env: dict[str, str]) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env},
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@glibc_linux
def test_thresholds_are_set_once_unless_the_environment_chose():
    probe = "from modelinit_wire.heap import keep_large_blocks; print(keep_large_blocks())"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env).stdout.strip() == "True"
    assert _run(probe, {"MALLOC_MMAP_THRESHOLD_": "1048576"}) == "False"
    assert _run(probe, {"MALLOC_TRIM_THRESHOLD_": "1048576"}) == "False"


HEAP_BLOCK = """
import atexit, ctypes, sys

def where_a_block_comes_from():  # an exit handler: run() calls them before it ends the process
    malloc = ctypes.CDLL(None).malloc
    malloc.restype = ctypes.c_void_p
    malloc.argtypes = (ctypes.c_size_t,)
    p = malloc(4 << 20)
    heap = [line for line in open("/proc/self/maps") if line.rstrip().endswith("[heap]")]
    lo, hi = (int(x, 16) for x in heap[0].split()[0].split("-")) if heap else (0, 0)
    print("from the heap:", lo <= p < hi)

atexit.register(where_a_block_comes_from)
from modelinit.cli import run
run()
"""


@glibc_linux
def test_the_cli_process_keeps_megabyte_blocks_in_its_heap():
    """A client process is new for every job, so its whole stream was a first one (tinyllama
    through a server: 246 k page faults against 24 k). After the CLI starts, a 4 MiB block comes
    from the heap (reused from block to block), not from a mapping of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", HEAP_BLOCK, "plan", "gpt2"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip().endswith("from the heap: True"), out.stdout[-300:]
