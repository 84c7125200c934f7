"""Re-export of :mod:`modelinit_wire.v1.modelinit_pb2` (the generated messages)."""
from modelinit_wire.v1.modelinit_pb2 import *  # noqa: F401,F403
from modelinit_wire.v1.modelinit_pb2 import DESCRIPTOR  # noqa: F401
