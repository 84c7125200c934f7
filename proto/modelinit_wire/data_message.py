"""The wire shape of a data message, which both sides handle without protobuf.

Nearly every message of an Init or Tensors stream is ``{data: payload}`` (1 MiB). Both response
messages carry ``data`` as field 2, so such a message is, on the wire, the field's tag (``0x12``:
field 2, length-delimited), the payload's length as a varint, and the payload, nothing else. The
server writes those bytes straight from its segment (:func:`encode`, one copy instead of three);
the client takes the payload as a view of the bytes gRPC received (:func:`payload_of`, no copy
instead of two). Everything else is a protobuf message as usual.
"""
from __future__ import annotations

#: Field 2 (``data``, in InitResponse and TensorsResponse), wire type 2 (length-delimited).
DATA_TAG = 0x12
#: The longest varint of a 64-bit length.
MAX_VARINT = 10


def encode(payload: memoryview) -> bytes:
    """The serialized ``{data: payload}`` message (the bytes ``SerializeToString`` makes), in one
    copy of the payload."""
    n = payload.nbytes
    head = bytearray((DATA_TAG,))
    while n >= 0x80:
        head.append(0x80 | (n & 0x7F))
        n >>= 7
    head.append(n)
    return b"".join((head, payload))


def payload_of(raw: bytes) -> memoryview | None:
    """The payload of ``raw`` when it is exactly one ``data`` field (tag, varint length, payload
    to the last byte), as a read-only view of ``raw``; None for any other message (other fields,
    a cut or overlong length: left to protobuf)."""
    if not raw or raw[0] != DATA_TAG:
        return None
    length, shift, k = 0, 0, 1
    while True:
        if k >= len(raw) or k > MAX_VARINT:
            return None
        byte = raw[k]
        length |= (byte & 0x7F) << shift
        k += 1
        if not byte & 0x80:
            break
        shift += 7
    if k + length != len(raw):
        return None  # more fields follow, or too few bytes
    return memoryview(raw)[k:]
