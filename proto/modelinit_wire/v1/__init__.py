"""Generated from proto/modelinit/v1/modelinit.proto by proto/generate.py (do not edit the
``*_pb2*`` files; regenerate them). ``modelinit.v1`` re-exports them for callers."""
