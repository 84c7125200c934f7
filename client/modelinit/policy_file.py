"""Init policies from JSON/YAML files or dicts, into the wire message ``modelinit.v1.Policy``.

    preset: hf-default            # optional: tried after the rules below
    rules:
      - name: residual            # optional, shown in plans and errors
        match: {roles: [attn_out, mlp_out]}   # kinds, roles, params, names (globs), min_layer, max_layer
        init: {normal: {std: 0.02}}
        depth_scaling: n_layers   # none (default) | n_layers | layer
      - match: {kinds: [norm]}
        init: ones                # zeros | ones | lecun_normal | {constant: 0.5} | {trunc_normal: {...}} ...

Only the shape is checked here (unknown keys, wrong types), with the field's path in the
message; the server validates the values (std > 0, a < b, ...) and answers INVALID_ARGUMENT.
"""
from __future__ import annotations

import json
import pathlib
from typing import Any, Mapping

from .v1 import modelinit_pb2 as pb

_DEPTH = {"none": pb.DEPTH_SCALING_NONE, "n_layers": pb.DEPTH_SCALING_N_LAYERS, "layer": pb.DEPTH_SCALING_LAYER}
_MATCH_LISTS = ("kinds", "roles", "params", "names")
_DISTRIBUTIONS = {
    "normal": ("mean", "std"),
    "trunc_normal": ("mean", "std", "a", "b", "bounds", "preserve_std"),
    "uniform": ("low", "high"),
    "constant": ("value",),
    "xavier_uniform": ("gain",),
    "xavier_normal": ("gain",),
    "kaiming_uniform": ("negative_slope", "mode", "nonlinearity"),
    "kaiming_normal": ("negative_slope", "mode", "nonlinearity"),
    "lecun_normal": (),
}
_SHORTHANDS = {
    "zeros": {"constant": {"value": 0.0}},
    "ones": {"constant": {"value": 1.0}},
    "lecun_normal": {"lecun_normal": {}},
}


def looks_like_file(text: str) -> bool:
    return text.endswith((".json", ".yaml", ".yml")) or "/" in text


def load(path: str | pathlib.Path) -> pb.Policy:
    """Read a policy file (``.json``, ``.yaml``/``.yml``); ValueError names the problem."""
    path = pathlib.Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"policy: cannot read policy file {str(path)!r}: {e}") from None
    if path.suffix == ".json":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"policy: {path.name} is not valid JSON: {e}") from None
    else:
        try:
            import yaml
        except ImportError:
            raise ValueError("policy: YAML policy files need PyYAML (pip install pyyaml); or write the policy as JSON") from None
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError(f"policy: {path.name} is not valid YAML: {e}") from None
    return from_dict(doc)


def from_dict(doc: Any) -> pb.Policy:
    """A policy document (as in the module docstring) as the wire message."""
    _expect(doc, Mapping, "policy", "a mapping with 'preset' and/or 'rules'")
    _no_unknown(doc, ("preset", "rules"), "policy")
    policy = pb.Policy(preset=_expect(doc.get("preset", ""), str, "policy.preset", "a preset name"))
    rules = _expect(doc.get("rules", []), list, "policy.rules", "a list of rules")
    for i, rule in enumerate(rules):
        policy.rules.append(_rule(rule, f"policy.rules[{i}]"))
    return policy


def _rule(doc: Any, where: str) -> pb.Rule:
    _expect(doc, Mapping, where, "a mapping with 'match' and 'init'")
    _no_unknown(doc, ("name", "match", "init", "depth_scaling", "zero_padding_row"), where)
    if "init" not in doc:
        raise ValueError(f"{where}.init: missing; give a distribution, e.g. {{normal: {{std: 0.02}}}} or 'zeros'")
    depth = doc.get("depth_scaling", "none")
    if depth not in _DEPTH:
        raise ValueError(f"{where}.depth_scaling: {depth!r} is not one of {', '.join(_DEPTH)}")
    return pb.Rule(
        name=_expect(doc.get("name", ""), str, f"{where}.name", "a string"),
        match=_match(doc.get("match", {}), f"{where}.match"),
        init=_distribution(doc["init"], f"{where}.init"),
        depth_scaling=_DEPTH[depth],
        zero_padding_row=_expect(doc.get("zero_padding_row", False), bool, f"{where}.zero_padding_row", "true or false"),
    )


def _match(doc: Any, where: str) -> pb.Match:
    _expect(doc, Mapping, where, "a mapping")
    _no_unknown(doc, (*_MATCH_LISTS, "min_layer", "max_layer"), where)
    m = pb.Match()
    for key in _MATCH_LISTS:
        values = doc.get(key, [])
        values = [values] if isinstance(values, str) else values
        _expect(values, list, f"{where}.{key}", "a list of strings")
        for v in values:
            getattr(m, key).append(_expect(v, str, f"{where}.{key}", "a list of strings"))
    for key in ("min_layer", "max_layer"):
        if key in doc:
            value = doc[key]
            if isinstance(value, bool) or not isinstance(value, int) or not -(2**31) <= value < 2**31:
                raise ValueError(f"{where}.{key}: must be a block index (an integer), got {value!r}")
            setattr(m, key, value)
    return m


def _distribution(doc: Any, where: str) -> pb.Distribution:
    if isinstance(doc, str):
        if doc not in _SHORTHANDS:
            raise ValueError(f"{where}: unknown shorthand {doc!r}; use {', '.join(_SHORTHANDS)} or a mapping like {{normal: {{std: 0.02}}}}")
        doc = _SHORTHANDS[doc]
    _expect(doc, Mapping, where, "a mapping with exactly one distribution")
    if len(doc) != 1 or next(iter(doc)) not in _DISTRIBUTIONS:
        raise ValueError(f"{where}: give exactly one of {', '.join(_DISTRIBUTIONS)} (got {', '.join(map(str, doc)) or 'none'})")
    kind, params = next(iter(doc.items()))
    if kind == "constant" and not isinstance(params, Mapping):
        params = {"value": params}
    params = params or {}
    _expect(params, Mapping, f"{where}.{kind}", "a mapping of parameters")
    _no_unknown(params, _DISTRIBUTIONS[kind], f"{where}.{kind}")
    fields = {}
    for key, value in params.items():
        path = f"{where}.{kind}.{key}"
        if key == "bounds":
            if value not in ("sigma", "absolute"):
                raise ValueError(f"{path}: {value!r} is not 'sigma' or 'absolute'")
            value = pb.BOUNDS_ABSOLUTE if value == "absolute" else pb.BOUNDS_SIGMA
        elif key in ("mode", "nonlinearity"):
            _expect(value, str, path, "a string")
        elif key == "preserve_std":
            _expect(value, bool, path, "true or false")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{path}: must be a number, got {value!r}")
        else:
            value = float(value)
        fields[key] = value
    return pb.Distribution(**{kind: getattr(pb, _message_name(kind))(**fields)})


def _message_name(kind: str) -> str:
    return {"normal": "Normal", "trunc_normal": "TruncNormal", "uniform": "Uniform", "constant": "Constant"}.get(kind, "FanScaled")


def _expect(value: Any, kind: type, where: str, what: str) -> Any:
    if not isinstance(value, kind):
        raise ValueError(f"{where}: must be {what}, got {value!r}")
    return value


def _no_unknown(doc: Mapping, allowed: tuple[str, ...], where: str) -> None:
    unknown = [k for k in doc if k not in allowed]
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(allowed)}")
