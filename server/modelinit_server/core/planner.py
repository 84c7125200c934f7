"""From a request to a plan: every tensor resolved, keyed, placed in a shard; every file's size known.

Planning is cheap (no weights are generated) and deterministic; the bytes of the files are then
a pure function of the plan (see :mod:`modelinit_server.produce.file_bytes`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from dataclasses import asdict, dataclass
from typing import Iterable

from ..engine import (
    ALGORITHM_VERSION,
    ALGORITHM_VERSIONS,
    DTYPE_ITEMSIZE,
    DTYPES,
    Sampler,
    canonical_name,
    check_dtype,
    tensor_key,
)
from ..engine.host_values import Computed
from . import layout
from .policies import Policy, Resolved, resolve
from .tensors import ModelSpec, TensorSpec

#: Refuse requests beyond this many parameters (10 trillion): far past any model served today,
#: and it keeps every size computation comfortably inside 64 bits.
MAX_PARAMS = 10**13


@dataclass(frozen=True)
class Request:
    """A validated init request (the core's view; the servicer builds it from the proto)."""

    model: ModelSpec
    """The architecture."""
    policy: Policy
    """The init policy."""
    seed: int
    """0 <= seed < 2^64."""
    dtype: str = "float32"
    """Output dtype, one of ``engine.DTYPES``."""
    max_shard_size: int = layout.DEFAULT_MAX_SHARD_SIZE
    """Largest total of tensor bytes in one shard (bytes, > 0)."""
    algorithm_version: int = ALGORITHM_VERSION
    """Generation algorithm, one of ``engine.ALGORITHM_VERSIONS`` (the wire's 0, "newest", is
    mapped to ``ALGORITHM_VERSION`` before this). 1 keys tensors by full HF name, 2 by canonical
    name (``model.base_model_prefix`` removed)."""

    def __post_init__(self) -> None:
        v = self.algorithm_version
        if isinstance(v, bool) or not isinstance(v, int) or v not in ALGORITHM_VERSIONS:
            use = " or ".join(str(x) for x in ALGORITHM_VERSIONS)
            raise ValueError(f"algorithm_version: unknown version {v!r}; use {use} (0 means the newest)")
        if not (isinstance(self.seed, int) and 0 <= self.seed < 2**64):
            raise ValueError(f"seed: must be an integer in [0, 2^64), got {self.seed!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: unknown dtype {self.dtype!r}; use one of: {', '.join(DTYPES)}")
        if not (isinstance(self.max_shard_size, int) and self.max_shard_size > 0):
            raise ValueError(f"max_shard_size: must be a positive number of bytes, got {self.max_shard_size!r}")
        if self.model.numel > MAX_PARAMS:
            raise ValueError(f"spec: {self.model.numel} parameters exceed the limit of {MAX_PARAMS}; check the config's sizes")


@dataclass(frozen=True)
class TensorPlan:
    """One tensor in the plan."""

    spec: TensorSpec
    resolved: Resolved
    key: tuple[int, int]
    """Philox key from (seed, name) in the request's algorithm version (version 2: canonical name)."""
    file: int
    """Index of the shard file holding it."""
    offset: int
    """Byte offset of its data inside the shard's data section."""
    nbytes: int

    @property
    def sampler(self) -> Sampler:
        return self.resolved.sampler


@dataclass(frozen=True)
class FilePlan:
    """One output file: a shard (header + tensor data) or a small JSON file (``content``)."""

    name: str
    size: int
    shard: bool
    header: bytes = b""
    """Shards: the safetensors header, length prefix included."""
    tensors: tuple[int, ...] = ()
    """Shards: indices into ``Plan.tensors``, in storage order."""
    content: bytes = b""
    """JSON files: the whole file."""


@dataclass(frozen=True)
class Plan:
    request: Request
    tensors: tuple[TensorPlan, ...]
    files: tuple[FilePlan, ...]
    fingerprint: str
    """SHA-256 hex of the weights' definition (independent of max_shard_size)."""

    @property
    def algorithm_version(self) -> int:
        """The generation algorithm the plan's bytes follow (the request's)."""
        return self.request.algorithm_version

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def total_params(self) -> int:
        return sum(t.spec.numel for t in self.tensors)

    def elements(self, files: Iterable[int] | None = None) -> int:
        """Elements the shards among ``files`` (indices into :attr:`files`; None: every file) hold."""
        return sum(self.tensors[t].spec.numel for i in (range(len(self.files)) if files is None else files)
                   for t in self.files[i].tensors)


def key_name(request: Request, name: str) -> str:
    """The name tensor ``name`` is keyed by in ``request``'s algorithm version: the full name in
    version 1, the canonical name (``base_model_prefix.`` removed) from version 2 on."""
    if request.algorithm_version == 1:
        return name
    return canonical_name(name, request.model.base_model_prefix)


def tensor_keys(request: Request) -> list[tuple[int, int]]:
    """The Philox key of each of the model's tensors, in order. Two stored tensors with one key
    (a head named like a backbone tensor once the prefix is removed) would have equal bytes: refused."""
    names = [key_name(request, t.name) for t in request.model.tensors]
    if len(set(names)) != len(names):
        seen: dict[str, str] = {}
        for t, n in zip(request.model.tensors, names):
            if n in seen:
                raise ValueError(
                    f"algorithm_version: tensors {seen[n]!r} and {t.name!r} share the canonical name {n!r} under "
                    f"version {request.algorithm_version}; request algorithm_version=1 (full names)"
                )
            seen[n] = t.name
    return [tensor_key(request.seed, n, request.algorithm_version) for n in names]


def fingerprint(request: Request, resolved: list[Resolved]) -> str:
    """SHA-256 over a canonical JSON of everything the bytes depend on (floats as exact reprs).

    From version 2 on the keys also depend on ``base_model_prefix``, so the document names it;
    version 1's document is unchanged (its fingerprints stay what they were)."""
    described: dict[Sampler, dict[str, str]] = {}  # many tensors share a sampler; its fields are scalars

    def describe(sampler: Sampler | Computed) -> dict[str, str]:
        if isinstance(sampler, Computed):  # its values follow from its source, under the spec's transformers
            return {"kind": "computed", "source": sampler.source, "transformers": request.model.transformers_version}
        if sampler not in described:
            described[sampler] = {k: repr(v) for k, v in asdict(sampler).items()}
        return described[sampler]

    doc: dict = {
        "algorithm_version": request.algorithm_version,
        "seed": request.seed,
        "dtype": request.dtype,
        "tensors": [[t.name, list(t.shape), describe(r.sampler)] for t, r in zip(request.model.tensors, resolved)],
    }
    if request.algorithm_version >= 2:
        doc["base_model_prefix"] = request.model.base_model_prefix
    return hashlib.sha256(json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()).hexdigest()


def resolve_request(request: Request, resolved: list[Resolved] | None = None
                    ) -> tuple[list[Resolved], list[tuple[int, int]], str]:
    """Everything the bytes of ``request``'s tensors depend on, without generating any: each
    tensor's rule and sampler (the policy resolved; the dtype must hold every sampler), its Philox
    key, and the fingerprint. The one planning core of :func:`build_plan` (files) and
    ``training.init_module_`` (a module's tensors), so both refuse and fingerprint alike.
    ``resolved``: ``resolve(request.policy, request.model)`` when the caller has it already (it
    depends on neither the seed nor the dtype: a server keeps it across seeds)."""
    if resolved is None:
        resolved = resolve(request.policy, request.model)
    resolved = _bind_computed(request, resolved)
    checked: set[Sampler] = set()  # many tensors share a sampler: check each once
    for t, r in zip(request.model.tensors, resolved):
        if isinstance(r.sampler, Computed):
            if request.dtype == "float16":  # the one dtype a model's computed values can overflow
                try:
                    r.sampler.check_dtype(request.dtype)
                except ValueError as e:
                    raise ValueError(f"dtype: {request.dtype} cannot hold {t.name!r} ({r.init}): {e}") from None
            continue
        if r.sampler in checked:
            continue
        try:
            check_dtype(r.sampler, request.dtype)  # overflow is a bad request, not a broken stream
        except ValueError as e:
            raise ValueError(f"dtype: {request.dtype} cannot hold {t.name!r} ({r.init}): {e}") from None
        checked.add(r.sampler)
    return resolved, tensor_keys(request), fingerprint(request, resolved)


def _bind_computed(request: Request, resolved: list[Resolved]) -> list[Resolved]:
    """Computed tensors bound to the request's seed: the first one whose values are needed runs the
    model's replay once for all of them (``ModelSpec.computed``); each random stream the replay
    draws is keyed like a tensor of that name."""
    model = request.model
    names = tuple(t.name for t, r in zip(model.tensors, resolved) if isinstance(r.sampler, Computed))
    if not names:
        return resolved
    if model.computed is None:
        raise ValueError(f"spec: {names[0]!r} is computed by its model's code, and this spec has no replay of it; "
                         "give it a distribution in the policy")
    memo: dict[str, object] = {}
    lock = threading.Lock()

    def keyer(stream: str) -> tuple[int, int]:
        return tensor_key(request.seed, key_name(request, stream), request.algorithm_version)

    def values_of(name: str):
        def values():
            with lock:
                if not memo:
                    memo.update(model.computed(names, keyer))
            return memo[name]

        return values

    return [dataclasses.replace(r, sampler=dataclasses.replace(r.sampler, values=values_of(t.name)))
            if isinstance(r.sampler, Computed) else r for t, r in zip(model.tensors, resolved)]


def build_plan(request: Request, resolved: list[Resolved] | None = None) -> Plan:
    """The plan of ``request``: its files (shards, headers, JSON files) and each tensor's place,
    sampler and key. ``resolved``: as :func:`resolve_request` takes it."""
    model = request.model
    resolved, keys, fp = resolve_request(request, resolved)
    itemsize = DTYPE_ITEMSIZE[request.dtype]
    nbytes = [t.numel * itemsize for t in model.tensors]
    groups = layout.pack_shards(nbytes, request.max_shard_size)
    metadata = {
        "format": "pt",
        "modelinit.algorithm_version": str(request.algorithm_version),
        "modelinit.seed": str(request.seed),
        "modelinit.fingerprint": fp,
    }

    tensors: list[TensorPlan | None] = [None] * len(model.tensors)
    files: list[FilePlan] = []
    weight_map: dict[str, str] = {}
    for f, group in enumerate(groups):
        name = layout.shard_name(f, len(groups))
        offset = 0
        for i in group:
            t = model.tensors[i]
            tensors[i] = TensorPlan(t, resolved[i], keys[i], f, offset, nbytes[i])
            offset += nbytes[i]
            weight_map[t.name] = name
        header = layout.safetensors_header(
            [(model.tensors[i].name, request.dtype, model.tensors[i].shape, nbytes[i]) for i in group], metadata
        )
        files.append(FilePlan(name, len(header) + offset, True, header=header, tensors=tuple(group)))

    json_files = []
    if len(groups) > 1:
        json_files.append((layout.INDEX_FILE, layout.index_json(sum(nbytes), weight_map)))
    json_files.append((layout.CONFIG_FILE, layout.config_json(model.config, request.dtype, model.transformers_version)))
    files += [FilePlan(name, len(content), False, content=content) for name, content in json_files]
    return Plan(request, tuple(tensors), tuple(files), fp)  # type: ignore[arg-type]
