"""modelinit_server: the engine, architectures, policies, shard writer and gRPC server of modelinit.

The numerical core (engine, architectures, policies, planner, files) imports no grpc; only
`servicer`, `convert` and `server` do.
"""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("modelinit")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
