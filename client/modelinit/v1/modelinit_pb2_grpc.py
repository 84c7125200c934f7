"""Re-export of :mod:`modelinit_wire.v1.modelinit_pb2_grpc` (the generated stubs)."""
from modelinit_wire.v1.modelinit_pb2_grpc import *  # noqa: F401,F403
