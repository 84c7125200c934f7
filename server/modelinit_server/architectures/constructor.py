"""What a model's constructor writes into the float tensors it makes (``torch.ones``, ``fill_``, a
``copy_`` of another tensor's law, ...), recorded while it is built on the meta device, for the
tensors ``_init_weights`` never writes: :func:`constructor_records` (read by
:func:`~.recorder.record_init` through ``meta_models``)."""
from __future__ import annotations

import contextlib
import math
from typing import Any, Callable

from ..core.tensors import HfInit
from .recorder import Record, _ARITHMETIC, _NOT_WRITES, _direct_record, _functions, _g, _is_number, scaled


#: Factories whose result is one value everywhere: (the value, from the call's arguments).
_FILLS: dict[str, Callable[[tuple, dict], Any]] = {
    "tensor": lambda a, k: a[0] if a else k.get("data"),
    "ones": lambda a, k: 1.0,
    "zeros": lambda a, k: 0.0,
    "full": lambda a, k: a[1] if len(a) > 1 else k.get("fill_value"),
}


#: Ops whose result has the values of their one tensor argument (shape aside).
_SAME_VALUES = frozenset({"view", "reshape", "unsqueeze", "squeeze", "expand", "expand_as", "clone", "contiguous",
                          "detach", "flatten", "repeat", "to", "float", "type_as", "__getitem__", "t", "transpose",
                          "permute"})
#: Elementwise ops evaluated on known constants (``torch.log(torch.tensor(0.5))``).
_ELEMENTWISE = frozenset({"log", "exp", "sqrt", "rsqrt", "neg", "log1p", "expm1", "sigmoid", "tanh", "reciprocal",
                          "abs", "sin", "cos", "pow", "add", "sub", "mul", "div", "true_divide", "__add__", "__radd__",
                          "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__", "__neg__",
                          "__pow__", "__rpow__", "softplus", "log2", "log10", "exp2", "square"})


class _StorageRecorder:
    """What a model's constructor writes, keyed by storage (``untyped_storage()._cdata``): a
    parameter shares its data's storage, so the record follows the tensor into the module."""

    def __init__(self) -> None:
        self.records: dict[int, Record] = {}
        self.keep: list[Any] = []  # the tensors stay alive, so their storage keys stay unique
        self.active = 0

    @staticmethod
    def key(t) -> int | None:
        try:
            return t.untyped_storage()._cdata
        except Exception:  # noqa: BLE001 - a tensor without storage
            return None

    def get(self, t) -> Record | None:
        k = self.key(t)
        return self.records.get(k) if k is not None else None

    def set(self, t, record: Record | None) -> None:
        k = self.key(t)
        if k is None:
            return
        if record is None:
            self.records.pop(k, None)
        else:
            self.records[k] = record
            self.keep.append(t)

    def law(self, t) -> HfInit | None:
        """The distribution ``t`` holds, when the constructor made it with one (``x.copy_(t)`` passes it on)."""
        r = self.get(t)
        return r.init if r is not None and r.init is not None and r.init.kind != "computed" else None

    def whole(self, t) -> bool:
        return t.untyped_storage().nbytes() == t.numel() * t.element_size() and t.storage_offset() == 0

    def write(self, tensor, init: HfInit | None, refusal: str = "") -> None:
        if not self.whole(tensor):
            self.set(tensor, Record(None, "the constructor writes only part of it"))
            return
        self.set(tensor, Record(init, refusal) if init is not None and init.kind != "computed"
                 else Record(None, refusal or f"the constructor computes it ({init.source if init else 'a write'})"))


@contextlib.contextmanager
def constructor_records():
    """While a model is built on the meta device: what its constructor writes into the float tensors
    it makes, for the tensors ``_init_weights`` never writes (yields {storage key: Record}).

    Followed: ``torch.nn.init`` calls and in-place draws and fills (``nn.Linear``'s own
    kaiming-uniform, GPT-1's ``Conv1D`` normal(0.02), a bias's uniform(±1/sqrt(fan_in)),
    ``torch.Tensor(d).uniform_()``); ``torch.randn``/``rand`` (register tokens, latents) and those
    scaled by a number; factories with one value (``torch.tensor(2.6592)``, ``torch.ones(d)``,
    ``torch.full``) and elementwise functions of such constants (``log(exp(0.8) - 1)``), evaluated
    on the CPU. A value the constructor computes any other way is a refusal, named if stored."""
    import torch
    from torch.overrides import TorchFunctionMode

    rec = _StorageRecorder()
    functions = _functions(rec)  # the same numbers as transformers.initialization's, keyed by storage

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            first = args[0] if args else kwargs.get("tensor")  # torch.nn.init passes it by keyword
            target = first if isinstance(first, torch.Tensor) else None
            if rec.active or name in _NOT_WRITES:
                return func(*args, **kwargs)
            if name in functions and target is not None and target.is_floating_point():
                functions[name](*args, **kwargs)  # torch.nn.init.*: the record ...
                rec.active += 1
                try:
                    return func(*args, **kwargs)  # ... and the real call (on meta)
                finally:
                    rec.active -= 1
            out = func(*args, **kwargs)
            if target is not None and target.is_floating_point() and (
                    name == "__setitem__" or (name.endswith("_") and not name.startswith("_"))):
                _written(rec, name, target, args, kwargs)
                return out
            if isinstance(out, torch.Tensor) and out.is_floating_point():
                record = _made(rec, func, name, args, kwargs, target)
                if record is not None:
                    rec.set(out, record)
            return out

    with Watch():
        yield rec.records


def _constant_of(r: Record | None) -> float | None:
    return r.init.value if r is not None and r.init is not None and r.init.kind == "constant" else None


def _written(rec: _StorageRecorder, name: str, target, args: tuple, kwargs: dict) -> None:
    """An in-place write into a float tensor the constructor made: ``tensor[...] = ...`` (computed), a
    number's scaling of the law it holds, or a draw or fill (:func:`~.recorder._direct_record`)."""
    if name == "__setitem__":
        rec.set(target, Record(None, "the constructor computes it (tensor[...] = ...)"))
        return
    previous = rec.get(target)
    x = args[1] if len(args) > 1 else kwargs.get("other")
    if name in _ARITHMETIC and _is_number(x) and previous is not None and previous.init is not None:
        new = scaled(previous.init, name, float(x))
        rec.set(target, Record(new) if new is not None else Record(None, f"the constructor computes it (tensor.{name})"))
    else:
        record = _direct_record(name, args[1:], kwargs)
        rec.write(target, record.init, record.refusal)


def _made(rec: _StorageRecorder, func, name: str, args: tuple, kwargs: dict, target) -> Record | None:
    """The record of a new float tensor: a factory with one value, torch's random factories, a view or
    copy of a recorded tensor, an elementwise function of constants or a number's scaling of a law;
    None for anything else."""
    import torch

    if func in (torch.tensor, torch.ones, torch.zeros, torch.full) and name in _FILLS:
        v = _FILLS[name](args, kwargs)
        return Record(HfInit("constant", value=float(v), source=f"constructor: {_g(v)}")) if _is_number(v) else None
    if name in ("randn", "randn_like"):
        return Record(HfInit("normal", mean=0.0, std=1.0, source=f"constructor: torch.{name}"))
    if name in ("rand", "rand_like"):
        return Record(HfInit("uniform", low=0.0, high=1.0, source=f"constructor: torch.{name}"))
    if name in _SAME_VALUES and target is not None and rec.get(target) is not None:
        return rec.get(target) if name not in ("__getitem__",) or _constant_of(rec.get(target)) is not None else None
    if name not in _ELEMENTWISE:
        return None
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    scalars = [a for a in args if not isinstance(a, torch.Tensor)]
    if tensors and all(_constant_of(rec.get(t)) is not None for t in tensors):
        v = _evaluate(rec, func, args, kwargs)
        return Record(HfInit("constant", value=v, source=f"constructor: {_g(v)}")) if v is not None else None
    if len(tensors) == 1 and len(scalars) == 1 and _is_number(scalars[0]) and rec.get(tensors[0]) is not None:
        prev = rec.get(tensors[0]).init
        op = {"mul": "mul_", "__mul__": "mul_", "__rmul__": "mul_", "div": "div_", "__truediv__": "div_",
              "true_divide": "div_", "add": "add_", "__add__": "add_", "__radd__": "add_", "sub": "sub_",
              "__sub__": "sub_"}.get(name)
        new = scaled(prev, op, float(scalars[0])) if prev is not None and op else None
        return Record(new) if new is not None else None
    return None


def _evaluate(rec: _StorageRecorder, func, args: tuple, kwargs: dict) -> float | None:
    """``func`` on one-element CPU stand-ins of constant tensors: the constant it gives, or None."""
    import torch

    def stand_in(a):
        if isinstance(a, torch.Tensor):
            v = _constant_of(rec.get(a))
            return torch.tensor(v, dtype=a.dtype, device="cpu") if v is not None else None
        return a

    new = [stand_in(a) for a in args]
    if any(n is None for n in new) or any(isinstance(v, torch.Tensor) for v in kwargs.values()):
        return None
    try:
        out = func(*new, **kwargs)
    except Exception:  # noqa: BLE001 - not a function of scalars after all
        return None
    if not isinstance(out, torch.Tensor) or out.numel() != 1:
        return None
    v = float(out.item())
    return v if math.isfinite(v) else None
