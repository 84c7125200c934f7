"""The ``modelinit.v1`` messages and stubs, where callers have always imported them:
``from modelinit.v1 import modelinit_pb2``. The generated code lives in ``modelinit_wire.v1``
(shared with the server); these modules re-export it."""
