"""The output layout: shard packing, canonical safetensors headers and the HF JSON files.

Everything here is bytes-exact and deterministic: the same plan yields the same files.
"""
from __future__ import annotations

import json
import struct
from typing import Any, Mapping, Sequence

from modelinit_wire.sizes import size_in_bytes

from ..engine import SAFETENSORS_DTYPE

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
DEFAULT_MAX_SHARD_SIZE = 5 * 10**9


def parse_size(text: str) -> int:
    """Parse ``max_shard_size``: ``"5GB"`` (10^9), ``"500MB"``, ``"1GiB"`` (2^30), ``"4096"``
    (``modelinit_wire.sizes``, the grammar the CLI checks too); empty -> 5GB."""
    return DEFAULT_MAX_SHARD_SIZE if text == "" else size_in_bytes(text, "max_shard_size")


def pack_shards(nbytes: Sequence[int], max_shard_size: int) -> list[list[int]]:
    """Greedy packing in canonical order: a tensor opens a new shard when it would overflow the
    current one (HF's rule); a tensor larger than the limit gets a shard of its own."""
    shards: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, n in enumerate(nbytes):
        if current and size + n > max_shard_size:
            shards.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    if current:
        shards.append(current)
    return shards


def shard_name(index: int, count: int) -> str:
    """HF naming: ``model.safetensors`` alone, else ``model-00001-of-00003.safetensors``."""
    return SINGLE_FILE if count == 1 else f"model-{index + 1:05d}-of-{count:05d}.safetensors"


def safetensors_header(
    entries: Sequence[tuple[str, str, Sequence[int], int]], metadata: Mapping[str, str]
) -> bytes:
    """Canonical header bytes (length prefix included) for ``(name, dtype, shape, nbytes)`` entries
    stored back to back in the given order. Compact JSON, ``__metadata__`` first, tensors in
    order, padded with spaces to a multiple of 8 bytes (as safetensors does)."""
    header: dict[str, Any] = {"__metadata__": dict(metadata)}
    offset = 0
    for name, dtype, shape, n in entries:
        header[name] = {"dtype": SAFETENSORS_DTYPE[dtype], "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    body = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    body += b" " * (-len(body) % 8)
    return struct.pack("<Q", len(body)) + body


def json_file(obj: Any) -> bytes:
    """How HF writes its JSON files: 2-space indent, sorted keys, trailing newline."""
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8")


def index_json(total_size: int, weight_map: Mapping[str, str]) -> bytes:
    return json_file({"metadata": {"total_size": total_size}, "weight_map": dict(weight_map)})


def config_json(config: Mapping[str, Any], dtype: str, transformers_version: str = "") -> bytes:
    """The HF config with the output dtype. transformers 5 reads `dtype` and `rope_parameters`;
    4.x reads `torch_dtype` and a top-level `rope_theta`: write both so either loads it right.
    ``transformers_version`` (the version that resolved a generic spec) is written as
    ``save_pretrained`` writes it: some config classes read it to decide how to load."""
    doc = {**config, "dtype": dtype, "torch_dtype": dtype}
    if transformers_version:
        doc["transformers_version"] = transformers_version
    rope = config.get("rope_parameters")
    if isinstance(rope, Mapping) and "rope_theta" in rope and "rope_theta" not in doc:
        doc["rope_theta"] = rope["rope_theta"]
    return json_file(doc)
