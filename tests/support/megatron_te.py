"""Megatron-Core's Transformer Engine layers (the Transformer Engine layer spec, and ``TEGroupedMLP``: the
only grouped experts 0.17 and later have) built on CPU, where Transformer Engine cannot be installed (it
needs CUDA to build and import).

While :func:`transformer_engine_stand_in` is entered, ``import transformer_engine`` (any submodule) finds a
stand-in, and Megatron's ``megatron.core.extensions.transformer_engine``, its spec provider and the GPT
layer specs are imported again against it, so that Megatron's own ``TELayerNormColumnParallelLinear``,
``TEColumnParallelLinear``, ``TERowParallelLinear``, ``TENorm``, ``TEDotProductAttention``,
``TEColumnParallelGroupedLinear``, ``TERowParallelGroupedLinear`` and ``TEGroupedMLP`` are defined and
built. The stand-in's modules hold their parameters as Transformer Engine's 2.x do (its
``pytorch/module/*.py``), each with no forward:

* :class:`Linear`: ``weight`` (out, in) of this rank (``out`` divided by ``tp_size`` when
  column-parallel, ``in`` when row-parallel), ``bias`` when asked (else an empty tensor, no parameter);
* :class:`LayerNormLinear`: its norm's ``layer_norm_weight`` (and ``layer_norm_bias`` for LayerNorm)
  over the whole input, then :class:`Linear`'s;
* :class:`RMSNorm`, :class:`LayerNorm`: ``weight`` (and ``bias``); :class:`DotProductAttention`: none;
* :class:`GroupedLinear`: ``weight{i}`` (out, in) per GEMM (a local expert), ``bias{i}`` when asked;
* an empty ``_extra_state`` (no FP8) where Transformer Engine saves one; every other name Megatron's
  modules read at import (``te.common.recipe``, the FP8 helpers, ...): an empty class or a no-op, used by
  no module built here.

What a rank holds, and where Megatron says it sits (``sharded_state_dict()``: the tensor-parallel axis,
the experts' global index, the SwiGLU factory of ``linear_fc1``, the fused norms' keys), is Megatron's
own code. The real layers (Transformer Engine on CUDA) are the GPU list's (benchmarks/gpu_session.sh,
test_stacks_cuda.py).

megatron-core is imported inside the functions: the tests skip without it first.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Iterator

import torch

#: The Transformer Engine release the stand-in says it is: one with per-GEMM weights (2.14 added
#: ``single_grouped_weight``, one packed parameter, off by default).
VERSION = "2.10.0"


class _Module(torch.nn.Module):
    """What Transformer Engine's modules save beside their parameters: an ``_extra_state``, empty
    without FP8 metadata (as Transformer Engine 2.x saves it)."""

    def get_extra_state(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.uint8)

    def set_extra_state(self, state) -> None:
        pass


class _Parallel(_Module):
    """What Transformer Engine's linears share: the local (in, out) of a tensor-parallel mode."""

    def _local(self, in_features: int, out_features: int, tp_size: int, parallel_mode) -> tuple[int, int]:
        if parallel_mode == "column":
            out_features //= tp_size
        elif parallel_mode == "row":
            in_features //= tp_size
        self.in_features, self.out_features, self.tp_size, self.parallel_mode = in_features, out_features, tp_size, parallel_mode
        return in_features, out_features


class GroupedLinear(_Parallel):
    """Transformer Engine's ``GroupedLinear`` as it registers its parameters (no forward)."""

    def __init__(self, num_gemms: int, in_features: int, out_features: int, *, tp_size: int = 1, bias: bool = True,
                 params_dtype=None, parallel_mode=None, device="cuda", **unused) -> None:
        super().__init__()
        i, o = self._local(in_features, out_features, tp_size, parallel_mode)
        self.num_gemms, self.use_bias = num_gemms, bias
        self.fp8 = self.fp8_calibration = self.primary_weights_in_fp8 = False
        self.fp8_meta = {"fp8_checkpoint": False}
        dtype = params_dtype or torch.float32
        for g in range(num_gemms):
            self.register_parameter(f"weight{g}", torch.nn.Parameter(torch.empty(o, i, device=device, dtype=dtype)))
            if bias:
                self.register_parameter(f"bias{g}", torch.nn.Parameter(torch.zeros(o, device=device, dtype=dtype)))
            else:  # as for Linear: an empty tensor, not a parameter
                setattr(self, f"bias{g}", torch.Tensor().to(dtype=dtype, device=device))

    def init_fp8_metadata(self, num_gemms: int = 1) -> None:
        pass


class Linear(_Parallel):
    """Transformer Engine's ``Linear`` as it holds its parameters: ``weight`` (out, in) of this rank,
    ``bias`` (out) when ``bias`` (whole when row-parallel)."""

    def __init__(self, in_features: int, out_features: int, *, tp_size: int = 1, bias: bool = True,
                 params_dtype=None, parallel_mode=None, device="cuda", **unused) -> None:
        super().__init__()
        i, o = self._local(in_features, out_features, tp_size, parallel_mode)
        dtype = params_dtype or torch.float32
        self.use_bias = bias
        self.weight = torch.nn.Parameter(torch.empty(o, i, device=device, dtype=dtype))
        # without a bias Transformer Engine keeps an empty tensor, not a parameter
        self.bias = torch.nn.Parameter(torch.zeros(o, device=device, dtype=dtype)) if bias else torch.Tensor().to(dtype)


class LayerNormLinear(Linear):
    """Transformer Engine's ``LayerNormLinear``: its norm's ``layer_norm_weight`` (and, for LayerNorm,
    ``layer_norm_bias``) over the whole input, then :class:`Linear`'s parameters."""

    def __init__(self, in_features: int, out_features: int, eps: float = 1e-5, *, normalization: str = "LayerNorm",
                 params_dtype=None, device="cuda", **kw) -> None:
        super().__init__(in_features, out_features, params_dtype=params_dtype, device=device, **kw)
        dtype = params_dtype or torch.float32
        self.eps, self.normalization = eps, normalization
        self.layer_norm_weight = torch.nn.Parameter(torch.ones(in_features, device=device, dtype=dtype))
        if normalization == "LayerNorm":
            self.layer_norm_bias = torch.nn.Parameter(torch.zeros(in_features, device=device, dtype=dtype))


class RMSNorm(torch.nn.Module):
    """Transformer Engine's ``RMSNorm``: ``weight`` over ``normalized_shape`` (``hidden_size`` before 2.0)."""

    def __init__(self, normalized_shape: int | None = None, eps: float = 1e-5, *, hidden_size: int | None = None,
                 params_dtype=None, device="cuda", **unused) -> None:
        super().__init__()
        self.size = normalized_shape or hidden_size
        self.weight = torch.nn.Parameter(torch.ones(self.size, device=device, dtype=params_dtype or torch.float32))


class LayerNorm(RMSNorm):
    """Transformer Engine's ``LayerNorm``: ``weight`` and ``bias``."""

    def __init__(self, normalized_shape: int | None = None, eps: float = 1e-5, *, params_dtype=None, device="cuda",
                 **kw) -> None:
        super().__init__(normalized_shape, eps, params_dtype=params_dtype, device=device, **kw)
        self.bias = torch.nn.Parameter(torch.zeros(self.size, device=device, dtype=params_dtype or torch.float32))


class DotProductAttention(_Module):
    """Transformer Engine's ``DotProductAttention``: no parameters (no softmax offset)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()


class _Anything(type):
    """An empty class's type: any attribute asked of the class is another empty class."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(name, (torch.nn.Module,), {"__module__": cls.__module__})


class _Names(types.ModuleType):
    """A stand-in module: what it is given, else an empty class (to subclass) per name asked."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        made = _Anything(name, (torch.nn.Module,), {"__module__": self.__name__})
        setattr(self, name, made)
        return made


class _Fp8State:
    @staticmethod
    def is_fp8_enabled() -> bool:
        return False


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds any ``transformer_engine.*`` module as a stand-in (:class:`_Names`)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] != "transformer_engine":
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _Names(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module) -> None:
        pass


def _stand_in() -> dict[str, types.ModuleType]:
    te = _Names("transformer_engine")
    te.__version__ = VERSION
    te.__path__ = []
    pytorch, common = _Names("transformer_engine.pytorch"), _Names("transformer_engine.common")
    pytorch.__path__ = common.__path__ = []
    pytorch.GroupedLinear, pytorch.Linear, pytorch.LayerNormLinear = GroupedLinear, Linear, LayerNormLinear
    pytorch.RMSNorm, pytorch.LayerNorm, pytorch.DotProductAttention = RMSNorm, LayerNorm, DotProductAttention
    fp8 = _Names("transformer_engine.pytorch.fp8")
    fp8.FP8GlobalStateManager = _Fp8State
    fp8.fp8_autocast = fp8.fp8_model_init = lambda *a, **k: contextlib.nullcontext()
    recipe, distributed = _Names("transformer_engine.common.recipe"), _Names("transformer_engine.pytorch.distributed")
    te.pytorch, te.common, pytorch.fp8, pytorch.distributed, common.recipe = pytorch, common, fp8, distributed, recipe
    return {m.__name__: m for m in (te, pytorch, common, fp8, recipe, distributed)}


#: Megatron's modules imported again against the stand-in (the extension, then what names its classes).
#: The hybrid ones where this megatron-core has HybridModel (0.17 and later).
_RELOADED = ("megatron.core.extensions.transformer_engine", "megatron.core.extensions.transformer_engine_spec_provider",
             "megatron.core.models.gpt.moe_module_specs", "megatron.core.models.gpt.gpt_layer_specs",
             "megatron.core.models.hybrid.hybrid_block", "megatron.core.models.hybrid.hybrid_layer_specs")


@contextlib.contextmanager
def transformer_engine_stand_in() -> Iterator[types.ModuleType]:
    """While inside, ``transformer_engine`` is the stand-in and Megatron's Transformer Engine extension
    is imported against it (yielded). On exit the stand-in leaves ``sys.modules``, and Megatron's
    modules are imported again without it (the models built inside keep their classes)."""
    import megatron.core.utils as mutils

    saved = {name: m for name, m in sys.modules.items() if name.split(".")[0] == "transformer_engine"}
    finder = _Finder()
    sys.modules.update(_stand_in())
    sys.meta_path.insert(0, finder)
    mutils._te_version = None  # Megatron caches the release it found
    try:
        yield _reload()
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if n.split(".")[0] == "transformer_engine"]:
            del sys.modules[name]
        sys.modules.update(saved)
        mutils._te_version = None
        _reload()


def _reload() -> types.ModuleType:
    modules = []
    for name in _RELOADED:
        try:
            modules.append(importlib.reload(importlib.import_module(name)))
        except ModuleNotFoundError:  # megatron-core 0.16 has no megatron.core.models.hybrid
            if not name.startswith("megatron.core.models.hybrid."):
                raise
    return modules[0]


def with_te_grouped_experts(layer_spec):
    """``layer_spec`` (a local GPT layer spec with MoE) with its experts Megatron's ``TEGroupedMLP`` (from
    its Transformer Engine spec provider, as ``moe_grouped_gemm`` with that spec gives them; inside
    :func:`transformer_engine_stand_in`, or where Transformer Engine is installed):
    a ``ModuleSpec`` in megatron-core 0.16, a ``functools.partial`` from 0.17 on."""
    provider = importlib.import_module("megatron.core.extensions.transformer_engine_spec_provider").TESpecProvider()
    mlp = layer_spec.submodules.mlp
    if hasattr(mlp, "keywords"):  # 0.17 and later: builders
        mlp.keywords["submodules"].experts = provider.grouped_mlp_modules(True)
    else:
        from megatron.core.transformer.spec_utils import ModuleSpec

        module, submodules = provider.grouped_mlp_modules(True, False)
        mlp.submodules.experts = ModuleSpec(module=module, submodules=submodules)
    return layer_spec


def as_sequential_experts(state: dict) -> dict:
    """TEGroupedMLP's tensors under SequentialMLP's names: ``experts.linear_fc1.weight{i}`` is local expert
    i's ``linear_fc1`` (Transformer Engine's GroupedLinear holds one (out, in) weight per expert, as
    SequentialMLP's expert holds its own)."""
    out = {}
    for n, t in state.items():
        head, _, leaf = n.rpartition(".experts.")
        fc, _, weight = leaf.partition(".")
        if fc in ("linear_fc1", "linear_fc2") and weight.startswith("weight") and weight[6:].isdigit():
            n = f"{head}.experts.local_experts.{weight[6:]}.{fc}.weight"
        out[n] = t
    return out
