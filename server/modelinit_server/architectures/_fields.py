"""Config-field checks and default filling that mirror the transformers config classes.

Each family declares a schema: field name -> (default, check). A check takes the field name and
the value and returns the value to store, or raises ``ValueError`` whose message starts with
``spec.config.<field>:`` and says how to fix it. The checks follow the types the (``@strict``)
transformers 5.x config classes enforce, so a config that passes here also loads there.
"""
from __future__ import annotations

import copy
import json
import math
from typing import Any, Callable, Mapping

#: Largest accepted tensor dimension (vocab, width, positions, ...).
MAX_DIM = 2**31
#: Largest accepted number of transformer blocks.
MAX_LAYERS = 10_000
#: Deepest nesting of objects and lists in a config (HF configs nest a handful of levels).
MAX_NESTING = 64

Check = Callable[[str, Any], Any]
Schema = Mapping[str, tuple[Any, Check]]

#: Keys of an input config that are never copied to the output: the dtype is the writer's
#: choice, and the version/provenance keys describe a saved checkpoint, not the spec.
DROPPED_KEYS = frozenset({"dtype", "torch_dtype", "transformers_version", "_name_or_path", "_commit_hash"})


#: transformers' ``to_json_file`` writes a non-finite float as ``{"__float__": "Infinity"}`` (also
#: ``-Infinity``, ``NaN``): strict JSON has no such numbers.
_SPECIAL_FLOATS = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}


def decode_special_floats(value: Any) -> Any:
    """``value`` with every ``{"__float__": "Infinity"}`` object (as transformers writes a config) made
    the float it stands for, at any depth; everything else unchanged."""
    if isinstance(value, dict):
        if len(value) == 1 and isinstance(value.get("__float__"), str) and value["__float__"] in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[value["__float__"]]
        return {k: decode_special_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_special_floats(v) for v in value]
    return value


def invalid(field: str, problem: str, fix: str) -> ValueError:
    """The error for a bad field: ``spec.config.<field>: <problem>; <fix>``."""
    where = f"spec.config.{field}" if field else "spec.config"
    return ValueError(f"{where}: {problem}; {fix}")


def load_document(config: Mapping[str, Any] | str) -> dict[str, Any]:
    """Parse a config given as a mapping or as the JSON text of a ``config.json``."""
    if isinstance(config, (str, bytes)):
        try:
            config = json.loads(config)
        except (ValueError, UnicodeDecodeError) as exc:
            raise invalid("", f"not valid JSON ({exc})", "pass the text of an HF config.json object") from None
        except RecursionError:
            raise invalid("", f"nested deeper than {MAX_NESTING} levels", "pass an HF config.json object") from None
    if not isinstance(config, Mapping):
        raise invalid("", f"must be a JSON object, got {type(config).__name__}", "pass an HF config.json object")
    _check_nesting(config)
    for key in config:
        if not isinstance(key, str):
            raise invalid("", f"key {key!r} is not a string", "use string keys as in config.json")
    # a private copy: the spec's config must not share nested objects with the caller's
    return copy.deepcopy(dict(config))


def _check_nesting(config: Mapping[str, Any]) -> None:
    """ValueError for objects and lists nested deeper than MAX_NESTING (checked without
    recursion: what reads the config later, a deepcopy first, recurses)."""
    stack: list[tuple[Any, int]] = [(config, 1)]
    seen: dict[int, int] = {}  # container id -> deepest level it was walked at (shared objects)
    while stack:
        value, level = stack.pop()
        if level > MAX_NESTING:
            raise invalid("", f"nested deeper than {MAX_NESTING} levels", "pass an HF config.json object")
        if seen.get(id(value), 0) >= level:
            continue
        seen[id(value)] = level
        children = value.values() if isinstance(value, Mapping) else value
        stack.extend((c, level + 1) for c in children if isinstance(c, (Mapping, list, tuple)))


def _is_int(value: Any) -> bool:
    # bool is an int subclass, but `true` is never a valid size
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def size(field: str, value: Any) -> int:
    """A positive tensor dimension no larger than :data:`MAX_DIM`."""
    if not _is_int(value) or value <= 0:
        raise invalid(field, f"must be a positive integer, got {value!r}", "set a whole number >= 1")
    if value > MAX_DIM:
        raise invalid(field, f"{value} is larger than {MAX_DIM}", f"use a value <= {MAX_DIM}")
    return value


def layers(field: str, value: Any) -> int:
    """A positive number of transformer blocks no larger than :data:`MAX_LAYERS`."""
    if not _is_int(value) or value <= 0:
        raise invalid(field, f"must be a positive integer, got {value!r}", "set a whole number >= 1")
    if value > MAX_LAYERS:
        raise invalid(field, f"{value} layers is more than {MAX_LAYERS}", f"use at most {MAX_LAYERS} layers")
    return value


def layer_index(field: str, value: Any) -> int:
    """A block index or count that may be 0 (Qwen2 ``max_window_layers``)."""
    if not _is_int(value) or not 0 <= value <= MAX_LAYERS:
        raise invalid(field, f"must be an integer in [0, {MAX_LAYERS}], got {value!r}", "set a layer index")
    return value


def optional(check: Check) -> Check:
    """Accept ``None`` (the transformers "derive it" marker) or whatever ``check`` accepts."""

    def check_optional(field: str, value: Any) -> Any:
        return None if value is None else check(field, value)

    return check_optional


def real(field: str, value: Any) -> float:
    """A finite number, stored as a float (the strict config classes reject ints for float fields)."""
    if not _is_number(value):
        raise invalid(field, f"must be a finite number, got {value!r}", "set a JSON number")
    return float(value)


def positive_real(field: str, value: Any) -> float:
    """A finite number > 0, stored as a float (epsilons, RoPE theta)."""
    value = real(field, value)
    if value <= 0:
        raise invalid(field, f"must be > 0, got {value}", "set a positive number")
    return value


def init_range(field: str, value: Any) -> float:
    """``initializer_range``: the std of HF's normal init, in (0, 1]."""
    value = real(field, value)
    if not 0 < value <= 1:
        raise invalid(field, f"must be in (0, 1], got {value}", "use a std such as 0.02")
    return value


def probability(field: str, value: Any) -> float | int:
    """A dropout probability in [0, 1]; int or float are both kept as given (``float | int`` fields)."""
    if not _is_number(value) or not 0 <= value <= 1:
        raise invalid(field, f"must be a number in [0, 1], got {value!r}", "set a probability such as 0.1")
    return value


def flag(field: str, value: Any) -> bool:
    """A JSON boolean."""
    if not isinstance(value, bool):
        raise invalid(field, f"must be true or false, got {value!r}", "use a JSON boolean")
    return value


def text(field: str, value: Any) -> str:
    """A string (activation names, summary types, ...)."""
    if not isinstance(value, str):
        raise invalid(field, f"must be a string, got {value!r}", "use a JSON string")
    return value


def token_id(field: str, value: Any) -> int | None:
    """A token id or ``None``; range checks that matter for shapes are done by the family."""
    if value is not None and not _is_int(value):
        raise invalid(field, f"must be an integer token id or null, got {value!r}", "use a whole number or null")
    return value


def token_ids(field: str, value: Any) -> int | list[int] | None:
    """A token id, a list of token ids, or ``None`` (``eos_token_id``)."""
    if isinstance(value, list):
        if not all(_is_int(v) for v in value):
            raise invalid(field, f"must list integer token ids, got {value!r}", "use whole numbers")
        return list(value)
    return token_id(field, value)


def mapping(field: str, value: Any) -> dict | None:
    """A JSON object or ``None`` (``rope_parameters``)."""
    if value is not None and not isinstance(value, Mapping):
        raise invalid(field, f"must be a JSON object or null, got {value!r}", "use an object or null")
    return None if value is None else dict(value)


def string_list(field: str, value: Any) -> list[str] | None:
    """A list of strings or ``None`` (``layer_types``)."""
    if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise invalid(field, f"must be a list of strings or null, got {value!r}", "use e.g. [\"full_attention\", ...]")
    return None if value is None else list(value)


def fill(document: Mapping[str, Any], schema: Schema) -> dict[str, Any]:
    """Fill the schema's defaults, check every schema field, and keep other keys as given.

    transformers keeps unknown config keys as attributes and writes them back, so they pass through
    here too, minus :data:`DROPPED_KEYS`.
    """
    config = {k: v for k, v in document.items() if k not in DROPPED_KEYS}
    for field, (default, check) in schema.items():
        config[field] = check(field, config.get(field, default))
    return config


def divisible(field: str, value: int, by_field: str, by: int) -> None:
    """Require ``value`` (the field ``field``) to be a multiple of ``by`` (the field ``by_field``)."""
    if value % by:
        raise invalid(
            by_field,
            f"{field} {value} is not divisible by {by_field} {by}",
            f"choose a {by_field} that divides {field}",
        )


def padding_row(field: str, pad: int | None, rows: int, table: str) -> int | None:
    """The embedding row ``nn.Embedding(rows, ..., padding_idx=pad)`` zeroes, or ``None``.

    torch accepts ``-rows <= pad < rows`` and counts negative indices from the end.
    """
    if pad is None:
        return None
    if not -rows <= pad < rows:
        raise invalid(
            field,
            f"{pad} is outside the {rows} rows of {table}",
            f"use an id in [0, {rows}) or null",
        )
    return pad % rows


def reject_true(config: Mapping[str, Any], field: str, why: str) -> None:
    """Refuse a flag that would add modules this service does not enumerate."""
    if config.get(field):
        raise invalid(field, why, f"set {field} to false or omit it")
