"""Values both sides of the wire agree on, defined here once.

The client's command line offers them as choices and defaults without the server extra; the
server and the engine take them from here too. Pure constants: importing this module imports
nothing else (the engine uses it, and the engine imports no grpc).
"""
from __future__ import annotations

#: Output dtypes, as ``ModelRequest.dtype`` and the safetensors header name them (F32, BF16, F16).
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")

#: Engines a server or the embedded mode can run on: ``auto`` (CUDA when present, else the CPU
#: kernel), ``cpu`` (numba), ``cuda`` (Triton), ``reference`` (the plain numpy definition).
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda", "reference")

#: Every generation algorithm version, oldest first (docs/determinism.md). Each stays available
#: forever; ``ModelRequest.algorithm_version`` 0 means the newest.
ALGORITHM_VERSIONS: tuple[int, ...] = (1, 2)
#: The newest algorithm version: what a request that names none gets.
ALGORITHM_VERSION: int = ALGORITHM_VERSIONS[-1]

#: Data bytes per stream message (``InitRequest.chunk_size``, ``TensorsRequest.chunk_size``): what
#: 0 means (stock gRPC receivers accept 4 MiB messages by default), and the most a request may ask.
#: modelinit's own client asks for the most: fewer messages carry the same bytes, each costing a
#: gRPC operation and a Python step on both sides (tinyllama through a server: 0.93x wall).
DEFAULT_CHUNK = 1 << 20
MAX_CHUNK = 3 << 20

# A server's default caps on a request (``modelinit serve --max-*``; 0 there means no cap). They
# are set well above every published model, so that a typo is refused instead of streaming
# terabytes (modelinit_server.service.limits explains each).
#: 2 trillion parameters (8 TB of float32): twice the largest open models (~1T).
DEFAULT_MAX_PARAMS = 2_000_000_000_000
#: 2^24 = 16,777,216: vocabularies (~262k) and hidden/intermediate sizes (~50k) are far below.
DEFAULT_MAX_DIM = 1 << 24
#: Convolution weights have up to 5 dimensions; 8 leaves room.
DEFAULT_MAX_RANK = 8
#: One million tensors: deepseek-v3 stored per expert has ~45,400.
DEFAULT_MAX_TENSORS = 1_000_000
#: Largest serialized request, in bytes (4 MiB, gRPC's own default message limit).
DEFAULT_MAX_REQUEST_BYTES = 4 << 20

#: Most characters of a request's value an error message quotes (either side): a hostile value
#: (a megabyte-long glob, a 400-digit number) is shown as an excerpt, never whole.
EXCERPT: int = 80

#: The width the ``mup`` preset's hidden stds are given at (microsoft/mup's examples use 256):
#: std = sigma·sqrt(MUP_BASE_WIDTH / width). Its learning rates scale by the same ratio (µP's
#: MuAdam / MuSGD): the server's preset and probe, and what ``explain`` prints, read it here.
MUP_BASE_WIDTH = 256
