"""modelinit_server: the engine, architectures, policies, planner, file producer and gRPC service.

Folders, top to bottom (each imports only those below it; pyproject.toml's import-linter
contracts check it, and a test runs them):

    service/        the gRPC adapter (server, servicer, security, limits, observability, the
                    ``serve`` command) and the same adapter in-process (embedded)
    probe/          ``modelinit probe``: the model filled with a policy's bytes, one measured
                    forward and backward pass, findings (beside service/: neither imports the other)
    training/       ``init_module_``: fill a materialized or sharded torch module in place
    produce/        the bytes of a plan: files and tensor slices, in bounded segments
    messages.py     wire messages (modelinit_wire.v1) <-> the core's dataclasses
    architectures/  a spec -> the exact tensors of its model
    core/           tensors, policies, planner, layout, explain: a request -> a plan
    engine/         the RNG (numpy reference, numba CPU and Triton CUDA kernels) and backends

Only service/ imports grpc. What the server shares with the client (stubs, events, credentials,
the policy text format, constants) is in ``modelinit_wire``; the server imports no client module.
"""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("modelinit")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
