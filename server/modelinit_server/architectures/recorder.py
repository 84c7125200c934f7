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
from .init_laws import DRAWN

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


def _g(x: Any) -> str:
    return f"{float(x):g}"


def _is_number(x: Any) -> bool:
    """A finite Python number (not a bool, not a tensor)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(float(x))


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
        self.derived: dict[int, tuple[HfInit, Any]] = {}
        """id of a tensor computed from a stored one by a number (``p / math.sqrt(n)``) -> (its law, the tensor)."""

    def law(self, tensor) -> HfInit | None:
        """The distribution ``tensor``'s values follow, if it is a whole stored tensor with a recorded
        draw or a number times one."""
        if id(tensor) in self.derived:
            return self.derived[id(tensor)][0]
        key, _, whole = self._target(tensor)
        previous = self.state.get(key) if key is not None and whole else None
        if previous is None or previous.init is None or previous.init.zero_row or previous.init.kind == "computed":
            return None
        return previous.init

    def derive(self, out, tensor, op: str, x: Any) -> None:
        """``out = tensor <op> x``: remembered when it is a recorded law scaled or shifted by a number."""
        law = self.law(tensor) if _is_number(x) else None
        new = scaled(law, op, float(x)) if law is not None else None
        if new is not None:
            self.derived[id(out)] = (new, out)

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
            self.state[key] = replace(previous, init=replace(previous.init, zero_row=True))
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
        if whole and _is_number(x) and previous is not None and previous.init is not None and not previous.init.zero_row:
            new = scaled(previous.init, op, float(x))
            if new is not None:
                self.state[key] = Record(new)
                return
        if previous is not None and previous.refusal:
            return
        self.state[key] = Record(computed("tensor[...] = ..." if op == "__setitem__" else f"tensor.{op.strip('_')}_"))

    def records(self) -> dict[str, Record]:
        out = {}
        for key, names in self.names.items():
            for name in names:
                if key in self.state:
                    out[name] = self.state[key]
        return out


def _functions(rec: _Recorder) -> dict[str, Callable]:
    def drawing(fname: str):
        law = DRAWN[fname]  # the one table: the same law the replay draws (init_laws)

        def record(tensor, *args, **kwargs):
            rec.write(tensor, law(tensor, *args, **kwargs))
            return tensor

        return record

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

    def refuse(fname: str, why: str):
        def refused(tensor, *args, **kwargs):
            rec.write(tensor, None, f"init.{fname} {why}")
            return tensor

        return refused

    def copy_(tensor, other):
        law = rec.law(other) if not getattr(tensor, "_is_hf_initialized", False) else None
        if law is not None and tuple(other.shape) == tuple(tensor.shape):  # p.copy_(p / sqrt(n)): a scaled draw
            rec.write(tensor, replace(law, source=f"{law.source}, copied"))
        else:
            rec.write(tensor, computed("init.copy_"))
        return tensor

    def computing(fname: str):
        def record(tensor, *args, **kwargs):
            rec.write(tensor, computed(f"init.{fname}"))
            return tensor

        return record

    out = dict(
        {fname: drawing(fname) for fname in DRAWN}, constant_=constant_, ones_=ones_, zeros_=zeros_,
        eye_=computing("eye_"), dirac_=computing("dirac_"), orthogonal_=computing("orthogonal_"), copy_=copy_,
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


def _direct_writes(rec: _Recorder):
    """A torch function mode that records in-place writes made outside transformers.initialization."""
    import torch
    from torch.overrides import TorchFunctionMode

    data_get = torch.Tensor.data.__get__
    functions = _functions(rec)

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            if (not rec.active and name in functions and not args and isinstance(kwargs.get("tensor"), torch.Tensor)
                    and getattr(func, "__module__", "") == "torch.nn.init"):
                functions[name](**kwargs)  # torch.nn.init.* called directly: recorded as transformers' own
            result = func(*args, **kwargs)
            if rec.active or not args or not isinstance(args[0], torch.Tensor):
                return result
            if name in _SCALAR_OPS and len(args) == 2 and isinstance(result, torch.Tensor):
                rec.derive(result, args[0], _SCALAR_OPS[name], args[1])
                return result
            if func is data_get:
                if isinstance(result, torch.Tensor):
                    rec.alias(result, args[0])
                return result
            if name in _NOT_WRITES:
                return result
            if name in _ARITHMETIC:
                x = args[1] if len(args) > 1 else kwargs.get("other")
                rec.modify(args[0], name, x)
            elif name == "__setitem__":  # tensor[i] = v: part of it rewritten
                rec.modify(args[0], name, None)
            elif name.endswith("_") and not name.startswith("_"):
                record = _direct_record(name, args[1:], kwargs)
                rec.write(args[0], record.init, record.refusal)
            return result

    return Watch()


#: In-place methods that change no values.
_NOT_WRITES = frozenset({"requires_grad_", "share_memory_", "retain_grad", "resize_", "set_", "detach_", "grad_",
                         "record_stream", "pin_memory", "as_strided_", "squeeze_", "unsqueeze_", "t_", "transpose_"})
#: Arithmetic by a number that makes a new tensor, as the in-place op it amounts to (``p / math.sqrt(n)``).
_SCALAR_OPS = {"mul": "mul_", "__mul__": "mul_", "div": "div_", "__truediv__": "div_", "true_divide": "div_",
               "add": "add_", "__add__": "add_", "sub": "sub_", "__sub__": "sub_"}
#: In-place arithmetic: by a number it scales or shifts a distribution (``p /= math.sqrt(n)``).
_ARITHMETIC = frozenset({"mul_", "div_", "add_", "sub_", "__imul__", "__itruediv__", "__iadd__", "__isub__"})


def _direct_record(op: str, args: tuple, kwargs: dict) -> Record:
    def arg(i: int, name: str, default: float) -> float:
        return float(args[i]) if len(args) > i else float(kwargs.get(name, default))

    if op == "normal_":
        mean, std = arg(0, "mean", 0.0), arg(1, "std", 1.0)
        what = f"tensor.normal_(mean={_g(mean)}, std={_g(std)})"
        return Record(HfInit("constant", value=mean, source=what) if std == 0 else HfInit("normal", mean=mean, std=std, source=what))
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
        clear_init_flags(model)
        model.initialize_weights()
    clear_init_flags(model)
    records = rec.records()
    built = getattr(model, "_modelinit_constructed", {})
    for name, t in model.state_dict(keep_vars=True).items():
        k = t.untyped_storage()._cdata if name not in records else None
        if k in built:  # set by the constructor and never written by the initialization
            records[name] = built[k]
    return records


def clear_init_flags(model) -> None:
    """Building the model may mark modules initialized; the recording must see every write."""
    for module in model.modules():
        if getattr(module, "_is_hf_initialized", False):
            module._is_hf_initialized = False
