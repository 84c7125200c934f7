"""A persistent cache of generic specs, so that only the first plan of an architecture pays for transformers.

Importing transformers costs seconds per process; resolving a spec with it costs milliseconds.
A resolved :class:`ModelSpec` is a pure function of (config document, class, transformers
version, the code that resolves it), so it is stored under the SHA-256 of exactly those, as JSON,
and read back instead of importing transformers. Any change of transformers or of the resolving
code (its source files are hashed) gives a new key; a file that cannot be read or parsed is
ignored and rebuilt. tests/server/architectures/test_generic.py proves a cached spec equal to a fresh one.

Location: ``$MODELINIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/modelinit``, else ``~/.cache/modelinit``;
``MODELINIT_CACHE_DIR=off`` disables it (a read-only home does too, silently).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import tempfile
from typing import Any, Callable

from ..core.tensors import HfInit, ModelSpec, TensorSpec
from .computed import replay_of

#: Bump when the stored layout changes.
FORMAT = 2
#: Files whose code decides a generic spec.
_SOURCES = ("hf.py", "meta_models.py", "recorder.py", "constructor.py", "init_laws.py", "computed.py", "roles.py", "spec_cache.py", "_fields.py",
            "../core/tensors.py", "../core/variance_scaling.py")


def cache_dir() -> pathlib.Path | None:
    configured = os.environ.get("MODELINIT_CACHE_DIR")
    if configured:
        return None if configured.lower() in ("off", "0", "none") else pathlib.Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "modelinit"


@functools.lru_cache(maxsize=1)
def _code_hash() -> str:
    here = pathlib.Path(__file__).resolve().parent
    h = hashlib.sha256()
    for name in _SOURCES:
        h.update((here / name).read_bytes())
    return h.hexdigest()


def key(document: dict[str, Any], architecture: str, transformers_version: str) -> str:
    text = json.dumps(
        {"format": FORMAT, "code": _code_hash(), "transformers": transformers_version,
         "architecture": architecture, "document": document},
        sort_keys=True, separators=(",", ":"), allow_nan=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()


def cached(document: dict[str, Any], architecture: str, transformers_version: str,
           build: Callable[[dict[str, Any], str], ModelSpec]) -> ModelSpec:
    """The spec from the cache, or ``build(document, architecture)`` stored there."""
    folder = cache_dir()
    if folder is None or not transformers_version:
        return build(document, architecture)
    try:
        path = folder / "specs" / f"{key(document, architecture, transformers_version)}.json"
    except (TypeError, ValueError):  # a document JSON cannot hold (it fails later with a clear error)
        return build(document, architecture)
    spec = _read(path)
    if spec is not None:
        return spec
    spec = build(document, architecture)
    _write(path, spec)
    return spec


def to_json(spec: ModelSpec) -> dict[str, Any]:
    tensors = []
    for t in spec.tensors:
        h = t.hf_init
        tensors.append([
            t.name, list(t.shape), t.kind, t.role, t.param, t.layer, t.fan_in, t.fan_out, t.padding_idx,
            None if h is None else [h.kind, h.mean, h.std, h.a, h.b, h.low, h.high, h.value, h.zero_row, h.source, h.origin],
        ])
    return {
        "family": spec.family, "architecture": spec.architecture, "config": dict(spec.config),
        "n_layers": spec.n_layers, "hidden_size": spec.hidden_size, "initializer_range": spec.initializer_range,
        "tied": dict(spec.tied), "base_model_prefix": spec.base_model_prefix,
        "transformers_version": spec.transformers_version, "tensors": tensors,
    }


def from_json(doc: dict[str, Any]) -> ModelSpec:
    tensors = []
    for name, shape, kind, role, param, layer, fan_in, fan_out, padding_idx, h in doc["tensors"]:
        hf_init = None if h is None else HfInit(
            h[0], mean=h[1], std=h[2], a=h[3], b=h[4], low=h[5], high=h[6], value=h[7], zero_row=h[8], source=h[9],
            origin=h[10],
        )
        tensors.append(TensorSpec(name, tuple(shape), kind=kind, role=role, param=param, layer=layer,
                                  fan_in=fan_in, fan_out=fan_out, padding_idx=padding_idx, hf_init=hf_init))
    return ModelSpec(
        family=doc["family"], architecture=doc["architecture"], config=doc["config"], tensors=tuple(tensors),
        n_layers=doc["n_layers"], hidden_size=doc["hidden_size"], initializer_range=doc["initializer_range"],
        tied=doc["tied"], base_model_prefix=doc["base_model_prefix"], transformers_version=doc["transformers_version"],
        computed=replay_of(doc["architecture"], doc["config"], tensors),
    )


def _read(path: pathlib.Path) -> ModelSpec | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return from_json(json.load(fh))
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def _write(path: pathlib.Path, spec: ModelSpec) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".spec-", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:  # dumps: json's C encoder (dump's is Python's, 5x slower)
            fh.write(json.dumps(to_json(spec), separators=(",", ":"), allow_nan=True))
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)  # type: ignore[possibly-undefined]
        except (OSError, NameError):
            pass
