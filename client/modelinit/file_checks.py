"""The checks of a written file's own bytes that need no regeneration: a safetensors shard's
header (its JSON, every tensor's dtype, shape and offsets, the fingerprint it records) and the
index's map of tensors to shards, each problem one line."""
from __future__ import annotations

import json
import struct
from typing import TypeGuard

from modelinit_wire.quoting import quote

INDEX_FILE = "model.safetensors.index.json"
MAX_HEADER = 100 << 20  # the safetensors format's own limit on the JSON header
MAX_INDEX = 100 << 20
"""Most bytes of model.safetensors.index.json kept to check it (a real index is a few MB)."""
_ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
}



def _is_int(x: object) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def check_header(head: bytes, size: int, fingerprint: str) -> tuple[list[str], dict[str, int] | None]:
    """Problems of a safetensors file's header, and its tensors' byte counts (None if unparsable).
    ``head``: the file's first bytes, at least the 8-byte length and the header it announces
    (what verify's scan of the file keeps); ``size``: the file's size."""
    if size < 8:
        return [f"safetensors header: file has {size} bytes, too short for the 8-byte header length"], None
    (n,) = struct.unpack("<Q", head[:8])
    if n > size - 8 or n > MAX_HEADER:
        return [f"safetensors header: header length {n} does not fit in the {size}-byte file"], None
    raw = head[8:8 + n]
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        return [f"safetensors header: not valid UTF-8 JSON ({e})"], None
    if not isinstance(header, dict):
        return ["safetensors header: not a JSON object"], None
    problems: list[str] = []
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        problems.append("safetensors header: __metadata__ is not a string-to-string map")
    elif "modelinit.fingerprint" in meta and meta["modelinit.fingerprint"] != fingerprint:
        problems.append(f"safetensors header: fingerprint {meta['modelinit.fingerprint']}, manifest says {fingerprint}")
    tensors: dict[str, int] = {}
    spans: list[tuple[int, int, str]] = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict):
            problems.append(f"tensor {quote(name)}: entry is not an object")
            continue
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in _ITEMSIZE:  # a list or an object is no dtype either
            problems.append(f"tensor {quote(name)}: unknown dtype {quote(dtype)}")
            continue
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            problems.append(f"tensor {quote(name)}: shape {quote(shape)} is not a list of non-negative integers")
            continue
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            problems.append(f"tensor {quote(name)}: data_offsets {quote(offsets)} is not [begin, end] with 0 <= begin <= end")
            continue
        count = 1
        for d in shape:
            count *= d
        nbytes = count * _ITEMSIZE[dtype]
        if offsets[1] - offsets[0] != nbytes:
            problems.append(f"tensor {name!r}: {dtype} {shape} needs {nbytes} bytes, data_offsets span {offsets[1] - offsets[0]}")
        tensors[name] = nbytes
        spans.append((offsets[0], offsets[1], name))
    data_size = size - 8 - n
    pos = 0
    for begin, end, name in sorted(spans):
        if begin != pos:
            what = "overlaps the previous tensor" if begin < pos else f"leaves a gap of {begin - pos} bytes before it"
            problems.append(f"tensor {name!r}: data starts at {begin}, expected {pos} ({what})")
        pos = max(pos, end)
    if pos != data_size:
        problems.append(f"safetensors header: tensor data ends at {pos}, the file's data section has {data_size} bytes")
    return problems, (tensors if not problems else None)


def check_index(data: bytes, shards: dict[str, dict[str, int] | None], manifest_names: set[str],
                 present: set[str]) -> list[str]:
    """Problems of model.safetensors.index.json (its bytes) against the shards' headers (name ->
    tensor bytes) and the files ``present`` in the folder."""
    try:
        index = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        return [f"not readable JSON ({e})"]
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        return ["weight_map: missing or not a tensor-to-file map"]
    problems = []
    for shard in sorted(set(weight_map.values())):
        if shard not in manifest_names or not shard.endswith(".safetensors"):
            problems.append(f"weight_map names {shard!r}, not a shard of this folder's manifest")
        elif shard not in present:
            problems.append(f"weight_map names {shard!r}, which does not exist")
    readable = {shard: tensors for shard, tensors in shards.items() if tensors is not None}
    if len(readable) == len(shards):  # only when every header could be read
        found = {name: shard for shard, tensors in readable.items() for name in tensors}
        for name in sorted(set(weight_map) - set(found)):
            problems.append(f"weight_map lists tensor {name!r}, which no shard holds")
        for name in sorted(set(found) - set(weight_map)):
            problems.append(f"weight_map misses tensor {name!r} (in {found[name]})")
        for name in sorted(set(found) & set(weight_map)):
            if weight_map[name] != found[name]:
                problems.append(f"weight_map puts tensor {name!r} in {weight_map[name]}, it is in {found[name]}")
        meta = index.get("metadata")
        total = meta.get("total_size") if isinstance(meta, dict) else None
        expected = sum(n for tensors in readable.values() for n in tensors.values())
        if total is not None and total != expected:
            problems.append(f"metadata.total_size is {total}, the shards hold {expected} tensor bytes")
    return problems
