"""The fuzz targets, by name: each takes one input as bytes and returns when the outcome is one its
contract allows (success, or the project's documented error for that input); anything else
propagates and is a finding. Time and memory are bounded by whoever runs them (``python -m fuzz.run``
gives libFuzzer a per-input timeout and an RSS limit; the tests give each input a deadline).

Each target module holds related inputs; :data:`TARGETS` is the registry the runner and the tests read.
"""
from __future__ import annotations

from .base import Target
from .files import FILE_TARGETS
from .inputs import INPUT_TARGETS
from .service import SERVICE_TARGETS

#: Every target by name (the corpus folder of each is fuzz/corpus/NAME).
TARGETS: dict[str, Target] = {t.name: t for t in (*SERVICE_TARGETS, *INPUT_TARGETS, *FILE_TARGETS)}

__all__ = ["TARGETS", "Target"]
