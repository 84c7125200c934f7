"""The spec argument both sides take from a caller: ``init_model(spec)``, ``modelinit init SPEC``
(client) and ``init_module_(module, spec=...)`` (server) read it by one rule, here.

A spec is a preset name (``"bert-base-uncased"``), a path to a ``config.json`` or to a folder
holding one, or a config dict. A string names a file when it ends in ``.json`` or exists on
disk (a ``os.PathLike`` always does); otherwise it is a preset name, which the server checks.
"""
from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Union

from .constants import DEFAULT_MAX_REQUEST_BYTES

#: Largest config.json read: what a server takes in one request by default (a config is kilobytes).
MAX_CONFIG_BYTES = DEFAULT_MAX_REQUEST_BYTES


@dataclass(frozen=True)
class Preset:
    """A preset name, as given."""

    name: str


@dataclass(frozen=True)
class Config:
    """A config document: the text of a ``config.json`` (str) or a dict the caller gave."""

    document: Union[str, dict]


def read_spec_argument(spec: Any) -> Preset | Config:
    """What ``spec`` names (the module docstring says how it is told). ``ValueError`` naming
    ``spec`` when a config file cannot be read (missing, unreadable, not UTF-8) or ``spec`` is
    none of a string, a path or a mapping."""
    if isinstance(spec, Mapping):
        return Config(dict(spec))
    if not isinstance(spec, (str, os.PathLike)):
        raise ValueError(f"spec: give a preset name, a config.json path or a config dict, got {type(spec).__name__}")
    path = pathlib.Path(spec)
    if isinstance(spec, os.PathLike) or path.suffix == ".json" or _exists(path):
        try:
            if path.is_dir():
                path = path / "config.json"
            with open(path, "rb") as fh:  # no more than the cap: /dev/zero, a huge file
                data = fh.read(MAX_CONFIG_BYTES + 1)
            if len(data) > MAX_CONFIG_BYTES:
                raise ValueError(f"larger than {MAX_CONFIG_BYTES >> 20} MiB; a config.json is kilobytes")
            return Config(data.decode("utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:  # ValueError: a NUL in the path, or the cap
            raise ValueError(f"spec: cannot read config file {str(path)!r}: {e}") from None
    return Preset(str(spec))


def _exists(path: pathlib.Path) -> bool:
    """Whether ``path`` names something on disk; False for a name no file can have (too long)."""
    try:
        return path.exists()
    except OSError:
        return False
