"""The wire shape of a data message, which both sides handle without protobuf.

Nearly every message of an Init or Tensors stream is ``{data: payload}`` (1 MiB). Both response
messages carry ``data`` as field 2, so such a message is, on the wire, the field's tag (``0x12``:
field 2, length-delimited), the payload's length as a varint, and the payload, nothing else. The
server writes those bytes straight from its segment (:func:`encode`, one copy instead of three);
the client takes the payload as a view of the bytes gRPC received (:func:`payload_of`, no copy
instead of two). A data message may carry its transit check beside the payload
(``InitResponse.crc32c``, field 4; ``TensorsResponse.crc32c``, field 3: a fixed32 after the
data): :func:`encode` appends it and :func:`data_of` reads it. Everything else is a protobuf message as usual.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

#: Field 2 (``data``, in InitResponse and TensorsResponse), wire type 2 (length-delimited).
DATA_TAG = 0x12
#: The transit check beside the data, wire type 5 (fixed32): ``crc32c`` is field 4 of InitResponse,
#: field 3 of TensorsResponse.
CRC32C_TAG = 0x25
TENSORS_CRC32C_TAG = 0x1D
#: The longest varint of a 64-bit length.
MAX_VARINT = 10


class Checked(NamedTuple):
    """A data message's payload and the running CRC32C the server sent beside it."""

    payload: memoryview
    crc32c: int


def encode(payload: memoryview, crc32c: int | None = None, crc_tag: int = CRC32C_TAG) -> bytes:
    """The serialized ``{data: payload}`` message, with ``crc32c: crc32c`` when given (``crc_tag``:
    the field's tag in this response type; the bytes ``SerializeToString`` makes, fields in number
    order), in one copy of the payload."""
    n = payload.nbytes
    head = bytearray((DATA_TAG,))
    while n >= 0x80:
        head.append(0x80 | (n & 0x7F))
        n >>= 7
    head.append(n)
    if crc32c is None:
        return b"".join((head, payload))
    return b"".join((head, payload, struct.pack("<BI", crc_tag, crc32c)))


def data_of(raw: bytes, crc_tag: int = CRC32C_TAG) -> memoryview | Checked | None:
    """The payload of a data message (:func:`payload_of`), or the payload and its CRC32C when the
    data field is followed by exactly the ``crc32c`` field (``crc_tag``: its tag in this response
    type); None for any other message."""
    payload = payload_of(raw)
    if payload is not None:
        return payload
    if len(raw) < 7 or raw[-5] != crc_tag:
        return None
    payload = payload_of(memoryview(raw)[:-5])
    if payload is None:
        return None
    return Checked(payload, struct.unpack_from("<I", raw, len(raw) - 4)[0])


def payload_of(raw: bytes | memoryview) -> memoryview | None:
    """The payload of ``raw`` when it is exactly one ``data`` field (tag, varint length, payload
    to the last byte), as a read-only view of ``raw``; None for any other message (other fields,
    a cut or overlong length: left to protobuf)."""
    if not len(raw) or raw[0] != DATA_TAG:
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
