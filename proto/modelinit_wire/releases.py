"""The releases installed beside modelinit that decide its bytes (or whether it builds a model at
all) and the training stacks found, against the lowest release of each that modelinit declares
(its installed metadata: ``pyproject.toml``'s ``>=`` bounds, each one the project has run on).

Read with ``importlib.metadata`` only: nothing here imports torch or the stacks, so the thin client's
``modelinit versions`` marks them in its report, and the server checks them before the first model
is built or a byte generated: below a floor, one line names the package, the version found and the one
needed. (transformers >= 5.23 disables its PyTorch backend below torch 2.6, after which every
transformers class looks absent; said as the version it is, that is one line with the fix.)"""
from __future__ import annotations

import functools
import importlib.metadata
import re

_TEST_EXTRA = re.compile(r"""extra\s*==\s*["']test["']""")
_FLOOR = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*>=\s*([0-9][0-9A-Za-z.]*)")


@functools.cache
def installed(name: str) -> str | None:
    """The installed version of distribution ``name``, or None. Read once per process: the version
    that counts is the one this process imported, and reading the metadata costs milliseconds (a
    scan of every installed distribution) on a path taken several times per request."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def floor(name: str) -> str | None:
    """The lowest release of ``name`` modelinit declares (its ``>=`` bound, the highest of them where
    several extras bound it; the test extra's, which pins what the tests need, aside), or None
    (not declared, or modelinit's metadata is not installed: a source tree)."""
    return _floors().get(_canonical(name))


@functools.cache
def _floors() -> dict[str, str]:
    """Every floor modelinit's installed metadata declares, by canonical name (read once)."""
    try:
        required = importlib.metadata.requires("modelinit") or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    floors: dict[str, str] = {}
    for m in map(_FLOOR.match, required):
        if m and not _TEST_EXTRA.search(m.string):
            name = _canonical(m.group(1))
            floors[name] = max(floors.get(name, m.group(2)), m.group(2), key=_release)
    return floors


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _release(version: str) -> tuple[int, ...]:
    """The release numbers of a version (``2.13.0+cpu`` -> (2, 13, 0); ``2.6.0rc1`` -> (2, 6, 0))."""
    head = re.match(r"[0-9]+(?:\.[0-9]+)*", version)
    return tuple(int(x) for x in head.group(0).split(".")) if head else ()


def below_floor(name: str) -> tuple[str, str] | None:
    """``(installed, floor)`` when ``name`` is installed below modelinit's floor for it, else None."""
    have, need = installed(name), floor(name)
    if have is None or need is None:
        return None
    return (have, need) if _release(have) < _release(need) else None


def below(*names: str) -> str | None:
    """One line for the first of ``names`` installed below modelinit's floor for it (the package, the
    version found, the one needed, the fix), or None."""
    for name in names:
        low = below_floor(name)
        if low is not None:
            return (f"{name} {low[0]} is installed; modelinit needs {name}>={low[1]} (the oldest release it has "
                    f"run on): pip install -U '{name}>={low[1]}'")
    return None
