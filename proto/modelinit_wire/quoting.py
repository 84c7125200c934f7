"""Values quoted in error messages: a short excerpt, never the whole of a hostile value.

A request may carry a megabyte-long glob, rule name or size string, a 400-digit number or a
structure nested hundreds deep; an error message quotes at most :data:`EXCERPT` characters of it
(``reprlib`` cuts long strings and numbers in the middle and stops at a few levels of nesting).
"""
from __future__ import annotations

import reprlib

from modelinit_wire.constants import EXCERPT

_repr = reprlib.Repr()
_repr.maxstring = EXCERPT
_repr.maxlong = 40
_repr.maxother = EXCERPT
_repr.maxlevel = 3


def quote(value: object, limit: int = EXCERPT) -> str:
    """``repr(value)``, or an excerpt of it of at most ``limit`` characters."""
    text = _repr.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
