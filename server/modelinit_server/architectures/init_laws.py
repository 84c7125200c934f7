"""``torch.nn.init``'s drawing functions as distributions: the one table from a call to its law.

transformers initializes through ``transformers.initialization``, whose functions mirror
``torch.nn.init``'s. Two places read those calls: the recorder (:mod:`.recorder`), which turns
each call into a rule of the plan, and the replay (:mod:`.computed`), which draws the values of a
computed tensor's inputs from the engine. Both take the distribution from :data:`DRAWN`, so a
call means the same law in a plan and in a replay.

Each entry takes the tensor being written and the function's own arguments (torch's signature,
defaults included) and returns the law as concrete numbers (fans already applied, as
``torch.nn.init`` computes them for the in-memory tensor), with the call as its ``source``.
The arithmetic of the fan-based stds is :mod:`~modelinit_server.core.variance_scaling`'s, in
torch's operation order.
"""
from __future__ import annotations

from typing import Any, Callable

from ..core.tensors import HfInit
from ..core.variance_scaling import nonlinearity_gain, uniform_bound, variance_scaling_std

#: Names torch's ``calculate_gain`` treats as linear (gain 1) besides ``linear`` itself.
_TORCH_LINEAR_FNS = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")


def torch_gain(nonlinearity: str, param: Any) -> float:
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


def _g(x: Any) -> str:
    return f"{float(x):g}"


def _fans(tensor) -> tuple[int, int]:
    import torch

    return torch.nn.init._calculate_fan_in_and_fan_out(tensor)


def uniform_(tensor, a=0.0, b=1.0, generator=None) -> HfInit:
    return HfInit("uniform", low=float(a), high=float(b), source=f"init.uniform_(a={_g(a)}, b={_g(b)})")


def normal_(tensor, mean=0.0, std=1.0, generator=None) -> HfInit:
    what = f"init.normal_(mean={_g(mean)}, std={_g(std)})"
    if float(std) == 0.0:  # torch fills the mean
        return HfInit("constant", value=float(mean), source=what)
    return HfInit("normal", mean=float(mean), std=float(std), source=what)


def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None) -> HfInit:
    what = f"init.trunc_normal_(mean={_g(mean)}, std={_g(std)}, a={_g(a)}, b={_g(b)})"
    if float(std) == 0.0:  # the mean, clamped to the bounds
        return HfInit("constant", value=min(max(float(mean), float(a)), float(b)), source=what)
    return HfInit("trunc_normal", mean=float(mean), std=float(std), a=float(a), b=float(b), source=what)


def xavier_uniform_(tensor, gain=1.0, generator=None) -> HfInit:
    bound = uniform_bound(variance_scaling_std(*_fans(tensor), "fan_avg", gain))
    return HfInit("uniform", low=-bound, high=bound, source=f"init.xavier_uniform_(gain={_g(gain)})")


def xavier_normal_(tensor, gain=1.0, generator=None) -> HfInit:
    std = variance_scaling_std(*_fans(tensor), "fan_avg", gain)
    return HfInit("normal", std=std, source=f"init.xavier_normal_(gain={_g(gain)})")


def _kaiming_std(tensor, a, mode, nonlinearity) -> float:
    fan_in, fan_out = _fans(tensor)
    return variance_scaling_std(fan_in, fan_out, "fan_in" if mode == "fan_in" else "fan_out", torch_gain(nonlinearity, a))


def kaiming_uniform_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None) -> HfInit:
    bound = uniform_bound(_kaiming_std(tensor, a, mode, nonlinearity))
    return HfInit("uniform", low=-bound, high=bound,
                  source=f"init.kaiming_uniform_(a={_g(a)}, mode={mode}, nonlinearity={nonlinearity})")


def kaiming_normal_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None) -> HfInit:
    return HfInit("normal", std=_kaiming_std(tensor, a, mode, nonlinearity),
                  source=f"init.kaiming_normal_(a={_g(a)}, mode={mode}, nonlinearity={nonlinearity})")


#: Function name -> ``law(tensor, *args, **kwargs)``: every drawing function with a law.
DRAWN: dict[str, Callable[..., HfInit]] = {
    "uniform_": uniform_, "normal_": normal_, "trunc_normal_": trunc_normal_,
    "xavier_uniform_": xavier_uniform_, "xavier_normal_": xavier_normal_,
    "kaiming_uniform_": kaiming_uniform_, "kaiming_normal_": kaiming_normal_,
}
