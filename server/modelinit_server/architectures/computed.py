"""The values of a model's computed tensors: its own initialization replayed, every draw from the engine.

Some tensors are not drawn from a distribution but computed by the model's ``_init_weights``
(:mod:`.recorder` marks them ``computed``): Mamba's ``A_log = log(arange(1, N + 1))`` and
``dt_bias = inverse_softplus(exp(uniform(log dt_min, log dt_max)))``, sinusoidal position tables,
a ``-inf`` mask, ``orthogonal_``. Their values come from running that same code again, with:

* only the computed tensors materialized, on the CPU, in float64 (every other tensor stays on
  the meta device, so the replay's memory is the computed tensors' size, not the model's);
* every write to any other tensor skipped (``transformers.initialization``'s functions are no-ops
  on them);
* every random draw (``init.normal_`` / ``uniform_`` / ``trunc_normal_`` and the fan-based ones,
  ``torch.rand`` / ``randn`` and their ``_like`` forms, ``tensor.uniform_`` / ``normal_``) taken
  from the engine: the c-th draw made while module ``M`` is initialized is stream ``M.#c``,
  keyed like a tensor of that name (:func:`~modelinit_server.core.planner.key_name`), so the
  values are a function of the seed alone;
* float factories promoted to float64 (``dtype=torch.float32`` and ``.float()`` become float64),
  so a formula is evaluated in double precision before the engine rounds it once to the output
  dtype.

What stays platform-dependent is named in docs/determinism.md: transcendental functions (log,
exp, sin) are torch's or numpy's float64 ones; a float64 result differs between CPUs by at most
an ulp or so, which changes the float32 rounding of a value with probability about 2**-28.
The replay runs twice with different global torch and numpy seeds: code that still draws from a
global generator (``np.random``) gives two results and is refused by name.
"""
from __future__ import annotations

import contextlib
import math
import threading
from typing import Any, Callable, Iterable

import numpy as np

from ..engine import Sampler
from ..engine.reference import transform, uniforms
from .init_laws import DRAWN
from .meta_models import clear_init_flags, meta_model

Keyer = Callable[[str], tuple[int, int]]

#: One replay at a time: it patches transformers.initialization and installs a torch function mode.
_LOCK = threading.Lock()
#: Most elements of the computed tensors of one model (float64 on the host).
MAX_COMPUTED_ELEMENTS = 1 << 28

_RANDOM_FACTORIES = ("rand", "randn", "rand_like", "randn_like")
_UNSUPPORTED_RANDOM = ("randint", "randint_like", "randperm", "bernoulli", "multinomial", "poisson", "normal",
                       "exponential_", "bernoulli_", "random_", "cauchy_", "log_normal_", "geometric_")
_FLOAT_FACTORIES = ("arange", "ones", "zeros", "full", "empty", "linspace", "logspace", "eye", "tensor", "as_tensor",
                    "ones_like", "zeros_like", "full_like", "empty_like")


def weight_norm_dim(model, name: str) -> int | None:
    """The ``dim`` of the weight-norm parametrization whose magnitude ``g`` is the tensor ``name``
    (``...parametrizations.weight.original0``); None when ``name`` is no such tensor."""
    owner, _, leaf = name.rpartition(".")
    if leaf != "original0" or not owner.endswith(".parametrizations.weight") and owner != "parametrizations.weight":
        return None
    try:
        plist = model.get_submodule(owner)
    except AttributeError:
        return None
    first = plist[0] if len(plist) == 1 else None
    if type(first).__name__ != "_WeightNorm":
        return None
    return int(first.dim)


def _sampler_of(h) -> Sampler:
    """The engine sampler of a recorded transformers rule (as ``hf-default`` resolves it)."""
    if h.kind == "normal":
        return Sampler("normal", mean=h.mean, std=h.std)
    if h.kind == "uniform":
        return Sampler("uniform", low=h.low, high=h.high)
    if h.kind == "trunc_normal":
        return _trunc(h.mean, h.std, h.a, h.b)
    if h.kind == "constant":
        return Sampler("constant", value=h.value)
    raise ValueError(f"a {h.kind} rule has no sampler")


class Replay:
    """``Replay(architecture, document, origins, drawn)(names, keyer)`` -> {stored name: float64 values}.

    ``origins`` maps each computed stored name to the in-memory tensor it is stored from; ``drawn``
    the recorded rule of each stored tensor a computed one is a function of (a weight-norm
    ``original1``, whose ``original0`` is its norm)."""

    def __init__(self, architecture: str, document: dict[str, Any], origins: dict[str, str],
                 drawn: dict[str, Any] | None = None) -> None:
        self.architecture = architecture
        self.document = document
        self.origins = dict(origins)
        self.drawn = dict(drawn or {})

    def __call__(self, names: Iterable[str], keyer: Keyer) -> dict[str, np.ndarray]:
        names = tuple(names)
        with _LOCK:
            model = self._meta_model()
            norms = {name: weight_norm_dim(model, self.origins.get(name, name)) for name in names}
            replayed = tuple(name for name in names if norms[name] is None)
            first = self._run(model, replayed, keyer, seed=0) if replayed else {}
            second = self._run(model, replayed, keyer, seed=1) if replayed else {}
        for name in replayed:
            a, b = first[name], second[name]
            if not np.array_equal(a, b, equal_nan=True):
                raise ValueError(
                    f"spec: {name!r}: the model's initialization draws from a global random generator that modelinit "
                    "cannot replace (numpy's, or a torch function it does not take from the engine); not supported"
                )
            if np.isnan(a).any():
                raise ValueError(f"spec: {name!r}: the replay of the model's initialization leaves "
                                 f"{int(np.isnan(a).sum())} of its values unset; not supported")
        for name, dim in norms.items():  # a function of another tensor's draw: computed once, no replay
            if dim is not None:
                origin = self.origins.get(name, name)
                first[name] = self._magnitude(name, model.get_parameter_or_buffer(origin[:-1] + "1").shape, dim, keyer)
        return {name: first[name] for name in names}

    def _meta_model(self):
        return meta_model(self.document, self.architecture)

    def _run(self, model, names: tuple[str, ...], keyer: Keyer, seed: int) -> dict[str, np.ndarray]:
        """The model's initialize_weights() with ``names`` materialized (again: each run starts from
        unset values) and the global generators seeded with ``seed``."""
        import torch

        targets: dict[str, Any] = {}
        total = 0
        for name in names:
            origin = self.origins.get(name, name)
            if origin in targets:
                continue
            t = model.get_parameter_or_buffer(origin)
            total += t.numel()
            if total > MAX_COMPUTED_ELEMENTS:
                raise ValueError(f"spec: the computed tensors hold more than {MAX_COMPUTED_ELEMENTS:,} elements; not supported")
            targets[origin] = _materialize(model, origin, t)
        torch_state, np_state = torch.get_rng_state(), np.random.get_state()
        try:
            torch.manual_seed(seed)
            np.random.seed(seed)
            with _replaying(model, targets, keyer):
                clear_init_flags(model)
                model.initialize_weights()
        finally:
            torch.set_rng_state(torch_state)
            np.random.set_state(np_state)
        return {name: targets[self.origins.get(name, name)].detach().to("cpu", torch.float64).numpy().reshape(-1).copy()
                for name in names}

    def _magnitude(self, name: str, v_shape, dim: int, keyer: Keyer) -> np.ndarray:
        """A weight-norm ``g``: the norm of ``v`` (its stored values as the engine draws them, in float32,
        as transformers' float32 model holds them) over every dimension but ``dim`` (all when -1)."""
        from ..engine.reference import generate_array

        v_name = name[: -len("original0")] + "original1"
        rule = self.drawn.get(v_name)
        if rule is None:
            raise ValueError(f"spec: {name!r} is the weight-norm magnitude of {v_name!r}, which is not drawn; not supported")
        n = math.prod(v_shape)
        v = generate_array(_sampler_of(rule), keyer(v_name), 0, n, "float32").astype(np.float64).reshape(tuple(v_shape))
        if dim == -1:
            return np.array([math.sqrt(float(np.sum(v * v)))])
        axes = tuple(i for i in range(v.ndim) if i != dim % v.ndim)
        return np.sqrt(np.sum(v * v, axis=axes)).reshape(-1)


def replay_of(architecture: str, config: dict[str, Any], tensors) -> Replay | None:
    """The replay that computes the computed ones of ``tensors`` (TensorSpecs), None when none is."""
    origins = {t.name: t.hf_init.origin for t in tensors if t.hf_init is not None and t.hf_init.kind == "computed"}
    if not origins:
        return None
    drawn = {t.name: t.hf_init for t in tensors if t.name.endswith(".original1") and t.hf_init is not None
             and t.hf_init.kind != "computed"}
    return Replay(architecture, {k: v for k, v in config.items() if k != "architectures"}, origins, drawn)


def _materialize(model, name: str, t):
    """Put a float64 CPU tensor (NaN: unwritten) where ``name`` is, as a parameter or a buffer."""
    import torch

    module_name, _, leaf = name.rpartition(".")
    module = model.get_submodule(module_name) if module_name else model
    value = torch.full(tuple(t.shape), float("nan"), dtype=torch.float64)
    if leaf in module._parameters:
        module._parameters[leaf] = torch.nn.Parameter(value, requires_grad=False)
    else:
        module._buffers[leaf] = value
    return value


class _Streams:
    """The engine's draws: one stream per (module being initialized, draw index)."""

    def __init__(self, keyer: Keyer) -> None:
        self.keyer = keyer
        self.module = ""
        self.count: dict[str, int] = {}

    def values(self, n: int, sampler: Sampler) -> np.ndarray:
        c = self.count.get(self.module, 0)
        self.count[self.module] = c + 1
        stream = f"{self.module}.#{c}" if self.module else f"#{c}"
        u = uniforms(self.keyer(stream), 0, n)
        if sampler.kind == "constant":
            return np.full(n, sampler.value)
        return transform(sampler, u)

    def tensor(self, shape, sampler: Sampler):
        import torch

        n = math.prod(shape)
        return torch.from_numpy(self.values(n, sampler)).reshape(tuple(shape))


def _normal(mean: float, std: float) -> Sampler:
    """torch's normal_: std 0 fills the mean."""
    return Sampler("constant", value=mean) if std == 0 else Sampler("normal", mean=mean, std=std)


def _trunc(mean: float, std: float, a: float, b: float) -> Sampler:
    return Sampler("trunc_normal", mean=mean, std=std, a=(a - mean) / std, b=(b - mean) / std)


@contextlib.contextmanager
def _replaying(model, targets: dict[str, Any], keyer: Keyer):
    """While inside, the model's own initialization runs with every draw taken from the engine
    (``transformers.initialization``'s functions and torch's random factories and in-place draws on
    the tensors the replay computes), in float64 where the code makes float tensors, each draw keyed
    by the module whose ``_initialize_weights`` runs."""
    import transformers.initialization as init_module

    from .recorder import RECORDED

    streams = _Streams(keyer)
    originals = {name: getattr(init_module, name) for name in RECORDED}
    active = [0]  # inside a replaced init function: torch calls pass through untouched
    wrapped = _track_modules(model, streams)
    try:
        for name, fn in _replacements(streams, originals).items():
            setattr(init_module, name, _guarded(fn, active))
        with _replay_mode(streams, active):
            yield
    finally:
        for name, fn in originals.items():
            setattr(init_module, name, fn)
        for m in wrapped:
            del m._initialize_weights


def _ours(t) -> bool:
    """A tensor the replay computes: a target or a temporary on the CPU (everything else is on meta)."""
    import torch

    return isinstance(t, torch.Tensor) and t.device.type != "meta"


def _draw(streams: _Streams, t, sampler: Sampler):
    import torch

    with torch.no_grad():
        t.copy_(streams.tensor(t.shape, sampler).to(t.dtype))
    return t


def _replacements(streams: _Streams, originals: dict[str, Callable]) -> dict[str, Callable]:
    """What each function of ``transformers.initialization`` becomes: a draw of its law from the
    engine, torch's orthogonal construction over engine draws, the real function for the constant
    ones, a refusal for ``sparse_``; any of them leaves a tensor the replay does not compute alone."""
    import torch

    def drawing(fname: str):
        law = DRAWN[fname]  # the one table: the same law the recorder puts in the plan (init_laws)

        def call(tensor, *args, **kwargs):
            return _draw(streams, tensor, _sampler_of(law(tensor, *args, **kwargs))) if _ours(tensor) else tensor

        return call

    def orthogonal_(tensor, gain=1.0, generator=None):
        """torch's construction (QR of a normal matrix, signs from R's diagonal), in float64 with numpy."""
        if not _ours(tensor):
            return tensor
        rows = tensor.shape[0]
        cols = tensor.numel() // rows
        flat = streams.values(rows * cols, Sampler("normal")).reshape(rows, cols)
        if rows < cols:
            flat = flat.T
        q, r = np.linalg.qr(flat)
        q = q * np.sign(np.diag(r))
        if rows < cols:
            q = q.T
        with torch.no_grad():
            tensor.copy_(torch.from_numpy(np.ascontiguousarray(q * gain)).reshape(tensor.shape))
        return tensor

    def passthrough(name: str):
        real = originals[name]

        def call(tensor, *args, **kwargs):
            if not _ours(tensor):
                return tensor
            return real(tensor, *args, **kwargs)

        return call

    def refused(name: str):
        def call(tensor, *args, **kwargs):
            if _ours(tensor):
                raise ValueError(f"spec: init.{name} draws a random pattern the engine cannot reproduce; not supported")
            return tensor

        return call

    return dict(
        {fname: drawing(fname) for fname in DRAWN}, orthogonal_=orthogonal_, sparse_=refused("sparse_"),
        constant_=passthrough("constant_"), ones_=passthrough("ones_"), zeros_=passthrough("zeros_"),
        eye_=passthrough("eye_"), dirac_=passthrough("dirac_"), copy_=passthrough("copy_"),
    )


def _guarded(fn: Callable, active: list[int]) -> Callable:
    """``fn`` under no_grad, with ``active`` counting the calls in progress."""
    import torch

    def call(*args, **kwargs):
        active[0] += 1
        try:
            with torch.no_grad():
                return fn(*args, **kwargs)
        finally:
            active[0] -= 1

    return call


def _replay_mode(streams: _Streams, active: list[int]):
    """A torch function mode for the model's own code outside the replaced functions: float tensors
    made in float64, torch's random factories and in-place ``uniform_``/``normal_`` drawn from the
    engine, the random functions the engine cannot reproduce refused."""
    import torch
    from torch.overrides import TorchFunctionMode

    f64 = torch.float64
    narrow = (torch.float32, torch.float16, torch.bfloat16)

    class Replaying(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            name = getattr(func, "__name__", "")
            if active[0]:
                return func(*args, **kwargs)
            if name in _FLOAT_FACTORIES and kwargs.get("dtype") in narrow:
                kwargs["dtype"] = f64
            if name in ("float", "half", "bfloat16") and args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point():
                return func(*args, **kwargs).to(f64) if args[0].device.type != "meta" else func(*args, **kwargs)
            if name == "to" and args and isinstance(args[0], torch.Tensor) and args[0].device.type != "meta":
                args = tuple(f64 if a in narrow else a for a in args)
                if kwargs.get("dtype") in narrow:
                    kwargs["dtype"] = f64
            if name in _RANDOM_FACTORIES:
                out = func(*args, **kwargs)
                if out.device.type == "meta":
                    return out
                sampler = Sampler("uniform", low=0.0, high=1.0) if name.startswith("rand") and "randn" not in name else Sampler("normal")
                return streams.tensor(out.shape, sampler).to(out.dtype if out.dtype != torch.float32 else f64)
            if name in ("uniform_", "normal_") and args and isinstance(args[0], torch.Tensor) and args[0].device.type != "meta":
                t = args[0]
                rest = list(args[1:])
                if name == "uniform_":
                    lo = float(rest[0]) if rest else float(kwargs.get("from", 0.0))
                    hi = float(rest[1]) if len(rest) > 1 else float(kwargs.get("to", 1.0))
                    return _draw(streams, t, Sampler("uniform", low=lo, high=hi))
                mean = float(rest[0]) if rest else float(kwargs.get("mean", 0.0))
                std = float(rest[1]) if len(rest) > 1 else float(kwargs.get("std", 1.0))
                return _draw(streams, t, _normal(mean, std))
            if name in _UNSUPPORTED_RANDOM and not _all_meta(args, kwargs):
                raise ValueError(f"spec: the model's initialization draws with torch's {name}, which modelinit cannot take "
                                 "from the engine; not supported")
            return func(*args, **kwargs)

    return Replaying()


def _track_modules(model, streams: _Streams) -> list:
    """Each module's ``_initialize_weights`` wrapped so that ``streams.module`` names the module whose
    init runs (its draws are keyed by it); returns the wrapped modules."""
    module_names = {id(m): n for n, m in model.named_modules()}
    wrapped = []
    for m in model.modules():
        if hasattr(m, "_initialize_weights") and hasattr(m, "_init_weights"):
            inner = m._initialize_weights

            def tracked(module, *a, _inner=inner, **k):
                previous = streams.module
                streams.module = module_names.get(id(module), "")
                try:
                    return _inner(module, *a, **k)
                finally:
                    streams.module = previous

            m._initialize_weights = tracked
            wrapped.append(m)
    return wrapped


def _all_meta(args, kwargs) -> bool:
    import torch

    tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    device = kwargs.get("device")
    if device is not None:
        return str(device) == "meta"
    return bool(tensors) and all(t.device.type == "meta" for t in tensors)
