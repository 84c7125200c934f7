"""Ceiling: python gRPC server-streaming of ready-made bytes over loopback, no generation, into a
sink: ``discard``, ``file`` (buffered) or ``direct`` (an O_DIRECT file, as modelinit writes).

    python benchmarks/baselines/grpc_ceiling.py CHUNK_BYTES TOTAL_BYTES [discard|file|direct]
"""
import os
import sys
import tempfile
import time
from concurrent import futures

import grpc
from modelinit.destinations.direct_file import DirectFile  # the writer modelinit itself uses

chunk = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 20
total = int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 30
sink = sys.argv[3] if len(sys.argv) > 3 else "discard"
block = os.urandom(chunk)


def serve(request, context):
    for _ in range(total // chunk):
        yield block
    if total % chunk:  # the same bytes as the model, not the whole chunks in them
        yield block[:total % chunk]


options = [("grpc.max_send_message_length", 8 << 20), ("grpc.max_receive_message_length", 8 << 20)]
server = grpc.server(futures.ThreadPoolExecutor(4), options=options)
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("ceiling.C", {
    "Stream": grpc.unary_stream_rpc_method_handler(serve, request_deserializer=bytes, response_serializer=bytes)}),))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=options)
call = channel.unary_stream("/ceiling.C/Stream", request_serializer=bytes, response_deserializer=bytes)
path = os.path.join(tempfile.gettempdir(), f"grpc-ceiling-{os.getpid()}.bin")
received = 0
start = time.perf_counter()
if sink == "discard":
    for message in call(b""):
        received += len(message)
else:
    out = DirectFile(path, direct=True) if sink == "direct" else open(path, "wb")
    try:
        for message in call(b""):
            out.write(message)
            received += len(message)
    finally:
        out.close()
        os.remove(path)
elapsed = time.perf_counter() - start
print(f"chunk {chunk >> 10} KiB sink={sink}: {received / elapsed / 1e9:.3g} GB/s ({received / 1e9:.2f} GB in {elapsed:.2f}s)")
server.stop(0)
