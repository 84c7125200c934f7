"""Init policies from JSON/YAML files or dicts, into the wire message ``modelinit.v1.Policy``,
and back (:func:`to_dict`: the same format, as ``modelinit.json`` records it).

    preset: hf-default            # optional: tried after the rules below
    rules:
      - name: residual            # optional, shown in plans and errors
        match: {roles: [attn_out, mlp_out], params: [weight]}   # kinds, roles, params, names (globs), min_layer, max_layer
        init: {normal: {std: 0.02}}
        depth_scaling: n_layers   # none (default) | n_layers | layer
      - match: {kinds: [norm]}
        init: ones                # zeros | ones | lecun_normal | {constant: 0.5} | {trunc_normal: {...}} ...

Only the shape is checked here (unknown keys, wrong types), with the field's path in the
message; the server validates the values (std > 0, a < b, ...) and answers INVALID_ARGUMENT.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
from typing import Any, Mapping

from .constants import EXCERPT
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


def from_arg(policy: Any) -> pb.Policy:
    """A policy as callers give it: None (hf-default), a preset name, a path to a JSON/YAML
    policy file, a policy dict, or the message itself. ValueError (field-named) for a bad one."""
    if isinstance(policy, pb.Policy):
        return policy
    if policy is None:
        return pb.Policy()
    if isinstance(policy, Mapping):
        return from_dict(policy)
    if isinstance(policy, os.PathLike) or looks_like_file(policy) or os.path.isfile(policy):
        return load(policy)
    return pb.Policy(preset=policy)


def looks_like_file(text: str) -> bool:
    return text.endswith((".json", ".yaml", ".yml")) or "/" in text


def load(path: str | pathlib.Path) -> pb.Policy:
    """Read a policy file (``.json``, ``.yaml``/``.yml``); ValueError names the problem."""
    path = pathlib.Path(path)
    try:
        with open(path, "rb") as fh:  # read no more than the cap (a FIFO, /dev/zero, a huge file)
            data = fh.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise ValueError(f"policy: {_show(str(path))} is larger than {MAX_FILE_BYTES:,} bytes (1 MiB), the limit for "
                             "a policy file; a policy is a few rules")
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError, ValueError) as e:  # ValueError: a NUL in the path
        raise ValueError(f"policy: cannot read policy file {_show(str(path))}: {_text(e, 200)}") from None
    name = _text(path.name, EXCERPT)
    if path.suffix == ".json":
        try:
            doc = json.loads(text)
        except RecursionError:
            raise ValueError(f"policy: {name} nests too deeply; a policy is a few levels deep") from None
        except ValueError as e:  # JSONDecodeError, or an integer of over 4300 digits
            raise ValueError(f"policy: {name} is not valid JSON: {_text(e, 200)}") from None
    else:
        try:
            import yaml
        except ImportError:
            raise ValueError("policy: YAML policy files need PyYAML (pip install pyyaml); or write the policy as JSON") from None
        try:
            doc = _load_yaml(text, name)
        except RecursionError:
            raise ValueError(f"policy: {name} nests too deeply; a policy is a few levels deep") from None
        except yaml.YAMLError as e:
            raise ValueError(f"policy: {name} is not valid YAML: {_text(e, 300)}") from None
    return from_dict(doc)


#: Largest policy file read (a policy is a few rules: kilobytes).
MAX_FILE_BYTES = 1 << 20
#: Most values a YAML policy may expand to through its aliases (``*name``): a file within
#: MAX_FILE_BYTES without aliases holds far fewer, so only an alias bomb reaches it.
MAX_YAML_VALUES = 1_000_000
#: Largest integer that converts to a finite double.
_MAX_FLOAT_INT = int(1.7976931348623157e308)


def _load_yaml(text: str, name: str) -> Any:
    """``yaml.safe_load``, refusing a document whose aliases expand it past MAX_YAML_VALUES
    (or make it recursive) before anything is built from it."""
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()  # the node graph: an alias is a shared node, not a copy
        if node is None:
            return None
        _check_expansion(node, name)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_expansion(root: Any, name: str) -> None:
    """Count the values of a composed YAML node graph as if every alias were copied out
    (each shared node counted once per use, computed once: linear in the graph's size)."""
    import yaml

    def children(node: Any) -> list:
        if isinstance(node, yaml.SequenceNode):
            return node.value
        if isinstance(node, yaml.MappingNode):
            return [n for pair in node.value for n in pair]
        return []

    sizes: dict[int, int] = {}  # id(node) -> values it expands to
    open_: set[int] = set()  # nodes being counted (their descendants are on the stack)
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, counted = stack.pop()
        key = id(node)
        if counted:
            open_.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in children(node))
            if sizes[key] > MAX_YAML_VALUES:
                raise ValueError(f"policy: {name}: its aliases (*name) expand it to more than {MAX_YAML_VALUES:,} values; "
                                 "a policy is a few rules (write it without aliases)")
            continue
        if key in sizes:
            continue
        if key in open_:
            raise ValueError(f"policy: {name}: an alias (*name) refers to a value that contains it; a policy cannot be recursive")
        open_.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children(node))


def _show(value: Any, limit: int = EXCERPT) -> str:
    """``repr(value)``, cut to an excerpt of at most ``limit`` characters: an error message
    never quotes a whole hostile value (a megabyte string, a 400-digit number, deep nesting)."""
    import reprlib

    r = reprlib.Repr()
    r.maxstring, r.maxlong, r.maxother, r.maxlevel = limit, 40, limit, 3
    text = r.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _text(error: object, limit: int) -> str:
    """A (parser's) message on one line, cut to ``limit`` characters."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
    if not isinstance(depth, str) or depth not in _DEPTH:
        raise ValueError(f"{where}.depth_scaling: {_show(depth)} is not one of {', '.join(_DEPTH)}")
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
                raise ValueError(f"{where}.{key}: must be a block index (an integer), got {_show(value)}")
            setattr(m, key, value)
    return m


def _distribution(doc: Any, where: str) -> pb.Distribution:
    if isinstance(doc, str):
        if doc not in _SHORTHANDS:
            raise ValueError(f"{where}: unknown shorthand {_show(doc)}; use {', '.join(_SHORTHANDS)} or a mapping like {{normal: {{std: 0.02}}}}")
        doc = _SHORTHANDS[doc]
    _expect(doc, Mapping, where, "a mapping with exactly one distribution")
    if len(doc) != 1 or next(iter(doc)) not in _DISTRIBUTIONS:
        raise ValueError(f"{where}: give exactly one of {', '.join(_DISTRIBUTIONS)} (got {_show(', '.join(map(str, doc))) if doc else 'none'})")
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
                raise ValueError(f"{path}: {_show(value)} is not 'sigma' or 'absolute'")
            value = pb.BOUNDS_ABSOLUTE if value == "absolute" else pb.BOUNDS_SIGMA
        elif key in ("mode", "nonlinearity"):
            _expect(value, str, path, "a string")
        elif key == "preserve_std":
            _expect(value, bool, path, "true or false")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{path}: must be a number, got {_show(value)}")
        elif isinstance(value, int) and not -_MAX_FLOAT_INT <= value <= _MAX_FLOAT_INT:
            raise ValueError(f"{path}: {_show(value)} is too large for a double (at most about 1.8e308)")
        else:
            value = float(value)
        fields[key] = value
    return pb.Distribution(**{kind: getattr(pb, _message_name(kind))(**fields)})


def to_dict(policy: pb.Policy) -> dict:
    """The policy document of a wire message: the exact inverse of :func:`from_dict`.

    ``from_dict(to_dict(p)) == p`` for every message ``from_dict`` makes, and ``to_dict`` of a
    document is that document in normal form: every distribution as ``{kind: {params}}``
    (shorthands written out), numbers as floats, and only what is set (a field at its default is
    left out, except the optional ``a``, ``b``, ``min_layer`` and ``max_layer``, which are kept
    when present). This one format is what policy files hold, what ``modelinit.json`` records
    and what ``plan --json`` / ``explain --json`` print, so any of them can be given back to
    ``--policy``. Fields the server ignores and a document cannot hold (a Kaiming ``gain``, the
    parameters of ``lecun_normal``) are dropped. ValueError for a message that is not a policy
    (an unknown depth scaling, a rule without a distribution).
    """
    doc: dict[str, Any] = {}
    if policy.preset:
        doc["preset"] = policy.preset
    rules = [_rule_to_dict(r, f"policy.rules[{i}]") for i, r in enumerate(policy.rules)]
    if rules:
        doc["rules"] = rules
    return doc


def _rule_to_dict(rule: pb.Rule, where: str) -> dict[str, Any]:
    depth = {v: k for k, v in _DEPTH.items()}.get(rule.depth_scaling)
    if depth is None:
        raise ValueError(f"{where}.depth_scaling: unknown value {rule.depth_scaling}")
    doc: dict[str, Any] = {}
    if rule.name:
        doc["name"] = rule.name
    match = _match_to_dict(rule.match)
    if match:
        doc["match"] = match
    doc["init"] = _distribution_to_dict(rule.init, f"{where}.init")
    if depth != "none":
        doc["depth_scaling"] = depth
    if rule.zero_padding_row:
        doc["zero_padding_row"] = True
    return doc


def _match_to_dict(m: pb.Match) -> dict[str, Any]:
    doc: dict[str, Any] = {key: list(getattr(m, key)) for key in _MATCH_LISTS if getattr(m, key)}
    for key in ("min_layer", "max_layer"):
        if m.HasField(key):
            doc[key] = getattr(m, key)
    return doc


def _distribution_to_dict(d: pb.Distribution, where: str) -> dict[str, Any]:
    kind = d.WhichOneof("kind")
    if kind is None:
        raise ValueError(f"{where}: missing; a rule needs a distribution")
    msg = getattr(d, kind)
    params: dict[str, Any] = {}
    for key in _DISTRIBUTIONS[kind]:
        value = getattr(msg, key)
        if key == "bounds":
            if value == pb.BOUNDS_ABSOLUTE:
                params[key] = "absolute"
        elif msg.DESCRIPTOR.fields_by_name[key].has_presence:
            if msg.HasField(key):
                params[key] = value
        elif isinstance(value, float):
            # -0.0 is kept (its sign reaches the bytes); a constant always shows its value.
            if value != 0.0 or math.copysign(1.0, value) < 0 or kind == "constant":
                params[key] = value
        elif value:
            params[key] = value
    return {kind: params}


def _message_name(kind: str) -> str:
    return {"normal": "Normal", "trunc_normal": "TruncNormal", "uniform": "Uniform", "constant": "Constant"}.get(kind, "FanScaled")


def _expect(value: Any, kind: type, where: str, what: str) -> Any:
    if not isinstance(value, kind):
        raise ValueError(f"{where}: must be {what}, got {_show(value)}")
    if isinstance(value, str) and not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate ("\ud800" in JSON): the wire format refuses it
            raise ValueError(f"{where}: {_show(value)} is not valid Unicode text") from None
    return value


def _no_unknown(doc: Mapping, allowed: tuple[str, ...], where: str) -> None:
    unknown = [k for k in doc if k not in allowed]
    if unknown:
        raise ValueError(f"{where}: unknown key {_show(unknown[0])}; allowed: {', '.join(allowed)}")
