"""Learn a model's hf-default rules by running its own initialization against recorders.

``PreTrainedModel.initialize_weights()`` runs on the meta-device model with every function of
``transformers.initialization`` replaced by a recorder, and a torch function mode watching for
anything else that writes a stored tensor in place (``weight.data.normal_()``, ``fill_``, ...).
Each write becomes a distribution with concrete numbers (fan-based ones resolved the way torch
resolves them for the in-memory tensor); a scalar ``mul_``/``div_``/``add_``/``sub_`` after it
scales or shifts that distribution. The last write to a tensor wins, as it does in transformers; a
zeroed padding row is kept beside the write it follows. A tensor whose final values the code
computes rather than draws (``init.copy_`` of a formula, another in-place operation, a partial
write, ``orthogonal_``, ``eye_``, a constant of ±inf) is recorded as ``computed``: its values come
from replaying the same code (:mod:`.computed`), every random draw taken from the engine. Only
``sparse_`` is refused, by name if such a tensor is stored.
"""
from __future__ import annotations

import contextlib
import math
import sys
from dataclasses import dataclass, replace
from typing import Any, Callable

from ..core.tensors import HfInit
from ..core.variance_scaling import nonlinearity_gain, uniform_bound, variance_scaling_std

#: The functions of ``transformers.initialization`` that write a tensor and are replaced here.
#: ``lecun_normal_`` / ``default_flax_embed_init_`` resolve to ``normal_`` / ``trunc_normal_`` /
#: ``uniform_`` through the module's globals, so they are recorded through those.
RECORDED = (
    "uniform_", "normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_", "xavier_uniform_", "xavier_normal_",
    "kaiming_uniform_", "kaiming_normal_", "trunc_normal_", "orthogonal_", "sparse_", "copy_",
)


@dataclass(frozen=True)
class Record:
    """The final state of one in-memory tensor after the model's initialization."""

    init: HfInit | None = None
    refusal: str = ""
    """Why the tensor's values cannot be reproduced (set instead of ``init``)."""
    zero_row_index: int | None = None


def _g(x: Any) -> str:
    return f"{float(x):g}"


def caller() -> str:
    """``Class.method (file.py:line)`` of the model code that made the current call: the first frame
    outside this package and torch, for plans and explain."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        if "/modelinit_server/" not in path and "/torch/" not in path and not path.endswith("/initialization.py"):
            name = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
            return f"{name} ({path.rsplit('/', 1)[-1]}:{frame.f_lineno})"
        frame = frame.f_back
    return "the model's code"


def computed(what: str) -> HfInit:
    """A record of values the model's code computes: ``what`` and where it was called."""
    return HfInit("computed", source=f"{what} in {caller()}")


def scaled(init: HfInit, op: str, x: float) -> HfInit | None:
    """``init`` after the in-place ``op`` (mul_, div_, add_, sub_) by the number ``x``; None when the
    result is not one of the engine's distributions."""
    if op in ("div_", "__itruediv__"):
        if x == 0:
            return None
        op, x = "mul_", 1.0 / x
    if op in ("sub_", "__isub__"):
        op, x = "add_", -x
    what = f"{init.source}, then tensor.{op}({_g(x)})"
    if op in ("mul_", "__imul__"):
        if init.kind == "constant":
            return replace(init, value=init.value * x, source=what)
        if x == 0:
            return HfInit("constant", value=0.0, source=what)
        if init.kind == "normal":
            return replace(init, mean=init.mean * x, std=init.std * abs(x), source=what)
        if init.kind == "uniform":
            lo, hi = sorted((init.low * x, init.high * x))
            return replace(init, low=lo, high=hi, source=what)
        if init.kind == "trunc_normal":
            a, b = sorted((init.a * x, init.b * x))
            return replace(init, mean=init.mean * x, std=init.std * abs(x), a=a, b=b, source=what)
        return None
    if op in ("add_", "__iadd__"):
        if init.kind == "constant":
            return replace(init, value=init.value + x, source=what)
        if init.kind in ("normal", "trunc_normal"):
            return replace(init, mean=init.mean + x, a=init.a + x, b=init.b + x, source=what)
        if init.kind == "uniform":
            return replace(init, low=init.low + x, high=init.high + x, source=what)
    return None


class _Recorder:
    def __init__(self, model) -> None:
        self.names: dict[int, list[str]] = {}
        self.objects: dict[int, Any] = {}
        for name, t in model.state_dict(keep_vars=True).items():
            self.names.setdefault(id(t), []).append(name)
            self.objects[id(t)] = t
        self.aliases: dict[int, tuple[int, Any]] = {}
        """id of a ``.data`` alias -> (id of the stored tensor, the alias, kept alive so its id stays unique)."""
        self.state: dict[int, Record] = {}
        self.active = 0  # >0 while a recorder function runs (its own torch calls are not writes)

    def _stored(self, tensor) -> tuple[int | None, Any]:
        """The stored tensor that ``tensor`` is, views or is a ``.data`` alias of, and the object whose layout it shares."""
        base = tensor
        while getattr(base, "_base", None) is not None:
            base = base._base
        if id(base) in self.names:
            return id(base), base
        if id(base) in self.aliases:
            key, alias = self.aliases[id(base)]
            return key, alias
        return None, None

    def alias(self, alias, of) -> None:
        key, _ = self._stored(of)
        if key is not None and alias is not of:
            self.aliases[id(alias)] = (key, alias)

    def _target(self, tensor) -> tuple[int | None, int | None, bool]:
        """(id of the stored tensor, row index if a single dim-0 row of it is written, whole)."""
        key, base = self._stored(tensor)
        if key is None:
            return None, None, False
        if base is tensor or (tuple(tensor.shape) == tuple(base.shape) and tensor.storage_offset() == base.storage_offset()):
            return key, None, True
        if base.dim() >= 1 and base.shape[0] > 0:
            row = base.numel() // base.shape[0]
            offset = tensor.storage_offset() - base.storage_offset()
            if tensor.numel() == row and tensor.is_contiguous() and offset % row == 0:
                return key, offset // row, False
        return key, None, False

    def write(self, tensor, init: HfInit | None, refusal: str = "") -> None:
        if getattr(tensor, "_is_hf_initialized", False):
            return  # transformers' own functions skip flagged tensors
        key, row, whole = self._target(tensor)
        if key is None:
            return
        if whole:
            self.state[key] = Record(init, refusal)
            return
        previous = self.state.get(key)
        zero = init is not None and init.kind == "constant" and init.value == 0.0
        if row is not None and zero and previous is not None and previous.init is not None and previous.init.kind != "computed":
            self.state[key] = replace(previous, init=replace(previous.init, zero_row=True), zero_row_index=row)
            return
        if refusal:
            self.state[key] = Record(None, refusal)
            return
        what = init.source if init is not None else "a write"
        self.state[key] = Record(computed(f"a partial write ({what})"))

    def modify(self, tensor, op: str, x: Any) -> None:
        """An in-place arithmetic ``op`` on a stored tensor: a scalar scales or shifts its recorded
        distribution; anything else leaves values only a replay can give."""
        if getattr(tensor, "_is_hf_initialized", False):
            return
        key, _, whole = self._target(tensor)
        if key is None:
            return
        previous = self.state.get(key)
        number = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(float(x))
        if whole and number and previous is not None and previous.init is not None and not previous.init.zero_row:
            new = scaled(previous.init, op, float(x))
            if new is not None:
                self.state[key] = Record(new)
                return
        if previous is not None and previous.refusal:
            return
        self.state[key] = Record(computed(f"tensor.{op.strip('_')}_"))

    def records(self) -> dict[str, Record]:
        out = {}
        for key, names in self.names.items():
            for name in names:
                if key in self.state:
                    out[name] = self.state[key]
        return out


def _functions(rec: _Recorder) -> dict[str, Callable]:
    import torch

    def fans(t):
        return torch.nn.init._calculate_fan_in_and_fan_out(t)

    def uniform_(tensor, a=0.0, b=1.0, generator=None):
        rec.write(tensor, HfInit("uniform", low=float(a), high=float(b), source=f"init.uniform_(a={_g(a)}, b={_g(b)})"))
        return tensor

    def normal_(tensor, mean=0.0, std=1.0, generator=None):
        rec.write(tensor, HfInit("normal", mean=float(mean), std=float(std), source=f"init.normal_(mean={_g(mean)}, std={_g(std)})"))
        return tensor

    def constant_(tensor, val):
        if not math.isfinite(float(val)):  # e.g. a mask of -inf: stored exactly, through the replay
            rec.write(tensor, computed(f"init.constant_({_g(val)})"))
        else:
            rec.write(tensor, HfInit("constant", value=float(val), source=f"init.constant_({_g(val)})"))
        return tensor

    def ones_(tensor):
        rec.write(tensor, HfInit("constant", value=1.0, source="init.ones_"))
        return tensor

    def zeros_(tensor):
        rec.write(tensor, HfInit("constant", value=0.0, source="init.zeros_"))
        return tensor

    def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
        rec.write(tensor, HfInit("trunc_normal", mean=float(mean), std=float(std), a=float(a), b=float(b),
                                 source=f"init.trunc_normal_(mean={_g(mean)}, std={_g(std)}, a={_g(a)}, b={_g(b)})"))
        return tensor

    # Fan-based functions resolve exactly as torch.nn.init does for the in-memory tensor (the
    # arithmetic: core.variance_scaling, torch's operation order).
    def xavier_uniform_(tensor, gain=1.0, generator=None):
        fan_in, fan_out = fans(tensor)
        bound = uniform_bound(variance_scaling_std(fan_in, fan_out, "fan_avg", gain))
        rec.write(tensor, HfInit("uniform", low=-bound, high=bound, source=f"init.xavier_uniform_(gain={_g(gain)})"))
        return tensor

    def xavier_normal_(tensor, gain=1.0, generator=None):
        fan_in, fan_out = fans(tensor)
        std = variance_scaling_std(fan_in, fan_out, "fan_avg", gain)
        rec.write(tensor, HfInit("normal", std=std, source=f"init.xavier_normal_(gain={_g(gain)})"))
        return tensor

    def _kaiming_std(tensor, a, mode, nonlinearity):
        fan_in, fan_out = fans(tensor)
        gain = _torch_gain(nonlinearity, a)
        return variance_scaling_std(fan_in, fan_out, "fan_in" if mode == "fan_in" else "fan_out", gain)

    def kaiming_uniform_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
        bound = uniform_bound(_kaiming_std(tensor, a, mode, nonlinearity))
        rec.write(tensor, HfInit("uniform", low=-bound, high=bound,
                                 source=f"init.kaiming_uniform_(a={_g(a)}, mode={mode}, nonlinearity={nonlinearity})"))
        return tensor

    def kaiming_normal_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
        std = _kaiming_std(tensor, a, mode, nonlinearity)
        rec.write(tensor, HfInit("normal", std=std, source=f"init.kaiming_normal_(a={_g(a)}, mode={mode}, nonlinearity={nonlinearity})"))
        return tensor

    def refuse(fname: str, why: str):
        def refused(tensor, *args, **kwargs):
            rec.write(tensor, None, f"init.{fname} {why}")
            return tensor

        return refused

    def computing(fname: str):
        def record(tensor, *args, **kwargs):
            rec.write(tensor, computed(f"init.{fname}"))
            return tensor

        return record

    out = dict(
        uniform_=uniform_, normal_=normal_, constant_=constant_, ones_=ones_, zeros_=zeros_, trunc_normal_=trunc_normal_,
        xavier_uniform_=xavier_uniform_, xavier_normal_=xavier_normal_, kaiming_uniform_=kaiming_uniform_,
        kaiming_normal_=kaiming_normal_,
        eye_=computing("eye_"), dirac_=computing("dirac_"), orthogonal_=computing("orthogonal_"), copy_=computing("copy_"),
        sparse_=refuse("sparse_", "draws a random sparsity pattern, which has no bit-reproducible equivalent in the engine"),
    )

    def guarded(fn):
        def call(*args, **kwargs):
            rec.active += 1
            try:
                return fn(*args, **kwargs)
            finally:
                rec.active -= 1

        return call

    return {name: guarded(fn) for name, fn in out.items()}


#: Names torch's ``calculate_gain`` treats as linear (gain 1) besides ``linear`` itself.
_TORCH_LINEAR_FNS = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")


def _torch_gain(nonlinearity: str, param: Any) -> float:
    """``torch.nn.init.calculate_gain(nonlinearity, param)``: torch's reading of the arguments (and
    its errors), the gains themselves from :func:`~modelinit_server.core.variance_scaling.nonlinearity_gain`."""
    if nonlinearity in _TORCH_LINEAR_FNS:
        return nonlinearity_gain("linear")
    if nonlinearity == "leaky_relu":
        if param is None:
            param = 0.01
        elif not ((not isinstance(param, bool) and isinstance(param, int)) or isinstance(param, float)):
            raise ValueError(f"negative_slope {param} not a valid number")
        return nonlinearity_gain("leaky_relu", param)
    if nonlinearity not in ("linear", "sigmoid", "tanh", "relu", "selu"):
        raise ValueError(f"Unsupported nonlinearity {nonlinearity}")
    return nonlinearity_gain(nonlinearity)


def _direct_writes(rec: _Recorder):
    """A torch function mode that records in-place writes made outside transformers.initialization."""
    import torch
    from torch.overrides import TorchFunctionMode

    data_get = torch.Tensor.data.__get__

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            result = func(*args, **kwargs)
            if rec.active or not args or not isinstance(args[0], torch.Tensor):
                return result
            if func is data_get:
                if isinstance(result, torch.Tensor):
                    rec.alias(result, args[0])
                return result
            name = getattr(func, "__name__", "")
            if name in _NOT_WRITES:
                return result
            if name in _ARITHMETIC:
                x = args[1] if len(args) > 1 else kwargs.get("other")
                rec.modify(args[0], name, x)
            elif name.endswith("_") and not name.startswith("_"):
                record = _direct_record(name, args[1:], kwargs)
                rec.write(args[0], record.init, record.refusal)
            return result

    return Watch()


#: In-place methods that change no values.
_NOT_WRITES = frozenset({"requires_grad_", "share_memory_", "retain_grad", "resize_", "set_", "detach_", "grad_",
                         "record_stream", "pin_memory", "as_strided_", "squeeze_", "unsqueeze_", "t_", "transpose_"})
#: In-place arithmetic: by a number it scales or shifts a distribution (``p /= math.sqrt(n)``).
_ARITHMETIC = frozenset({"mul_", "div_", "add_", "sub_", "__imul__", "__itruediv__", "__iadd__", "__isub__"})


def _direct_record(op: str, args: tuple, kwargs: dict) -> Record:
    def arg(i: int, name: str, default: float) -> float:
        return float(args[i]) if len(args) > i else float(kwargs.get(name, default))

    if op == "normal_":
        mean, std = arg(0, "mean", 0.0), arg(1, "std", 1.0)
        return Record(HfInit("normal", mean=mean, std=std, source=f"tensor.normal_(mean={_g(mean)}, std={_g(std)})"))
    if op == "uniform_":
        lo, hi = arg(0, "from", 0.0), arg(1, "to", 1.0)
        return Record(HfInit("uniform", low=lo, high=hi, source=f"tensor.uniform_({_g(lo)}, {_g(hi)})"))
    value = args[0] if args else kwargs.get("value")
    if op == "fill_" and isinstance(value, (int, float)) and math.isfinite(float(value)):
        v = arg(0, "value", 0.0)
        return Record(HfInit("constant", value=v, source=f"tensor.fill_({_g(v)})"))
    if op == "zero_":
        return Record(HfInit("constant", value=0.0, source="tensor.zero_()"))
    return Record(computed(f"tensor.{op}"))


#: Factories whose result is one value everywhere: (the value, from the call's arguments).
_FILLS: dict[str, Callable[[tuple, dict], Any]] = {
    "tensor": lambda a, k: a[0] if a else k.get("data"),
    "ones": lambda a, k: 1.0,
    "zeros": lambda a, k: 0.0,
    "full": lambda a, k: a[1] if len(a) > 1 else k.get("fill_value"),
}


@contextlib.contextmanager
def constructor_constants():
    """While a model is built on the meta device: the float tensors its constructor makes with one
    known value (``torch.tensor(2.6592)``, ``torch.ones(d)``, ``torch.full(...)``, those times or
    divided by a number), which keep it until they become parameters: yields a dict filled with
    {storage key: value} (``untyped_storage()._cdata``; a parameter shares its data's storage).
    CLIP's ``logit_scale`` and DINOv2's layer-scale ``init_values * torch.ones(d)`` are set there,
    never by ``_init_weights``. An in-place op on such a tensor forgets it."""
    import torch
    from torch.overrides import TorchFunctionMode

    values: dict[int, float] = {}
    keep: list[Any] = []  # the tensors stay alive, so their storage keys stay unique

    def number(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(float(x))

    def key(t) -> int | None:
        try:
            return t.untyped_storage()._cdata
        except Exception:  # noqa: BLE001 - a tensor without storage
            return None

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name = getattr(func, "__name__", "")
            if not isinstance(out, torch.Tensor) or not out.is_floating_point():
                return out
            if name.endswith("_") and args and isinstance(args[0], torch.Tensor):
                values.pop(key(args[0]), None)  # changed in place: no longer a known value
                return out
            value = None
            if func in (torch.tensor, torch.ones, torch.zeros, torch.full) and name in _FILLS:
                v = _FILLS[name](args, kwargs)
                value = float(v) if number(v) else None
            elif name in ("mul", "__mul__", "__rmul__", "div", "__truediv__") and len(args) == 2:
                t, x = (args[0], args[1]) if isinstance(args[0], torch.Tensor) else (args[1], args[0])
                k = key(t) if isinstance(t, torch.Tensor) else None
                if k in values and number(x):
                    v = values[k]
                    value = v / float(x) if name in ("div", "__truediv__") else v * float(x)
            if value is not None and (k := key(out)) is not None:
                values[k] = value
                keep.append(out)
            return out

    with Watch():
        yield values


def record_init(model) -> dict[str, Record]:
    """Run ``model.initialize_weights()`` against recorders; the final record of each stored tensor (by state_dict name)."""
    import transformers.initialization as init_module

    rec = _Recorder(model)
    replacements = _functions(rec)
    originals = {name: getattr(init_module, name) for name in replacements}
    with contextlib.ExitStack() as stack:
        for name, fn in replacements.items():
            setattr(init_module, name, fn)
        stack.callback(lambda: [setattr(init_module, n, f) for n, f in originals.items()])
        stack.enter_context(_direct_writes(rec))
        _clear_flags(model)
        model.initialize_weights()
    _clear_flags(model)
    records = rec.records()
    constants = getattr(model, "_modelinit_constants", {})
    for name, t in model.state_dict(keep_vars=True).items():
        k = t.untyped_storage()._cdata if name not in records else None
        if k in constants:  # set by the constructor and never written by the initialization
            v = constants[k]
            records[name] = Record(init=HfInit(kind="constant", value=v, source=f"constructor: {_g(v)}"))
    return records


def _clear_flags(model) -> None:
    """Building the model may mark modules initialized; the recording must see every write."""
    for module in model.modules():
        if getattr(module, "_is_hf_initialized", False):
            module._is_hf_initialized = False
