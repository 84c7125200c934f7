"""Sizes as people write them, ``5GB`` (10^9 bytes), ``500MB``, ``2GiB`` (2^30), ``4096``: what
``max_shard_size`` (server) and the CLI's ``--max-shard-size``, ``--rate`` and
``--memory-budget`` (client) take. One grammar, so that a size the CLI accepts is one the server
accepts (``modelinit job`` checks ``--max-shard-size`` before it starts N pods).

The units are ``transformers``' ``save_pretrained(max_shard_size=...)`` ones: decimal KB, MB,
GB, TB and binary KiB, MiB, GiB, TiB, case-insensitive; no unit (or ``B``) is bytes.
"""
from __future__ import annotations

import re

from .quoting import quote

#: A unit (upper-cased) -> its multiplier.
UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
#: The units as an error message lists them.
UNIT_NAMES = "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"
#: The largest size :func:`size_in_bytes` returns: 4 EiB, beyond anything a file can be.
MAX_SIZE = 2**62

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def split_size(text: str) -> tuple[str, int] | None:
    """The number of a size as written (``"1.5"``) and its unit's multiplier; None when ``text``
    is not a size (no number, a negative one, an unknown unit)."""
    m = _SIZE.match(text)
    if m is None or m.group(2).upper() not in UNITS:
        return None
    return m.group(1), UNITS[m.group(2).upper()]


def size_in_bytes(text: str, field: str) -> int:
    """The bytes of a size, exactly: ``int(number) * unit`` for a whole number (no float rounding
    at 2^53 and up), ``int(float(number) * unit)`` for a fraction. ``ValueError`` naming ``field``
    when it is not a size, not above 0, or above :data:`MAX_SIZE`."""
    parts = split_size(text)
    if parts is None:
        raise ValueError(f"{field}: cannot parse {quote(text)}; give bytes or a number with a unit ({UNIT_NAMES}), e.g. '5GB'")
    number, unit = parts
    if len(number.partition(".")[0].lstrip("0")) > 19:  # over 10^19: no int or float arithmetic on it
        raise ValueError(f"{field}: {quote(text)} is absurdly large; use at most 4 EiB")
    size = int(float(number) * unit) if "." in number else int(number) * unit
    if size <= 0:
        raise ValueError(f"{field}: must be > 0 bytes, got {quote(text)}")
    if size > MAX_SIZE:
        raise ValueError(f"{field}: {quote(text)} is absurdly large; use at most 4 EiB")
    return size
