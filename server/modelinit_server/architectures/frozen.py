"""Read-only JSON documents: the shared preset configs, which no caller may change for the next.

:func:`freeze` turns nested dicts and lists into :class:`FrozenDict` and :class:`FrozenList`:
subclasses of dict and list (so ``json.dumps``, ``==`` and ``isinstance`` treat them as the plain
ones) whose every mutating method raises ``TypeError`` where the mutation is attempted. A copy
(``copy.copy``, ``copy.deepcopy``, ``dict(d)``, ``d.copy()``, pickling) is a plain, writable one:
a copy is how a caller gets a document to change (transformers 5, for one, writes ``rope_theta``
into the ``rope_scaling`` it is given).
"""
from __future__ import annotations

import copy
from typing import Any, NoReturn


def _refuse(self, *args, **kwargs) -> NoReturn:
    raise TypeError(f"this {type(self).__name__} is read-only (a shared preset config): change a copy "
                    "(copy.deepcopy of it, or from_preset/from_config, which copy)")


def _thaw(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_thaw(v) for v in value]
    return value


class FrozenDict(dict):
    """A dict that refuses every change; its copies are plain dicts."""

    __slots__ = ()
    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _refuse  # type: ignore[assignment]

    def __copy__(self) -> dict:
        return dict(self)

    def __deepcopy__(self, memo: dict) -> dict:
        return copy.deepcopy(_thaw(self), memo)

    def __reduce__(self):
        return dict, (_thaw(self),)


class FrozenList(list):
    """A list that refuses every change; its copies are plain lists."""

    __slots__ = ()
    __setitem__ = __delitem__ = append = extend = insert = pop = remove = clear = sort = reverse = _refuse  # type: ignore[assignment]
    __iadd__ = __imul__ = _refuse  # type: ignore[assignment]

    def __copy__(self) -> list:
        return list(self)

    def __deepcopy__(self, memo: dict) -> list:
        return copy.deepcopy(_thaw(self), memo)

    def __reduce__(self):
        return list, (_thaw(self),)


def freeze(value: Any) -> Any:
    """``value`` with every nested dict and list made read-only (scalars as they are)."""
    if isinstance(value, dict):
        return FrozenDict((k, freeze(v)) for k, v in value.items())
    if isinstance(value, list):
        return FrozenList(freeze(v) for v in value)
    return value
