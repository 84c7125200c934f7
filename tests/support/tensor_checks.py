"""Written tensors against the law they should follow, for the tests that compare modelinit's output
with transformers' own initialization (the generic path, the computed tensors).

Statistical tolerances come from the sample size n: the sample mean is within K standard errors
(K * sigma / sqrt(n)) of the expected mean, and the sample std within a relative
K * sqrt(1 / (2 (n - 1))) of the expected sigma (normal theory; uniform and truncated normals have
lighter tails, so it is conservative for them too).
"""
from __future__ import annotations

import math
import pathlib

import torch
from modelinit_server.core import policies
from modelinit_server.core.tensors import HfInit

K = 6.0


def read_tensors(folder: pathlib.Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def _phi(x: float) -> float:
    return 0.0 if math.isinf(x) else math.exp(-x * x / 2) / math.sqrt(2 * math.pi)


def _cdf(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def moments_of_rule(h: HfInit) -> tuple[float, float, float | None]:
    """(mean, sigma, constant value or None) of a recorded transformers rule, from its own numbers."""
    if h.kind == "constant":
        return h.value, 0.0, h.value
    if h.kind == "normal":
        return h.mean, h.std, None
    if h.kind == "uniform":
        return (h.low + h.high) / 2, (h.high - h.low) / math.sqrt(12), None
    a, b = (h.a - h.mean) / h.std, (h.b - h.mean) / h.std  # torch's trunc_normal_ bounds are absolute
    z = _cdf(b) - _cdf(a)
    shift = (_phi(a) - _phi(b)) / z
    xa = 0.0 if math.isinf(a) else a * _phi(a)
    xb = 0.0 if math.isinf(b) else b * _phi(b)
    var = 1 + (xa - xb) / z - shift * shift
    return h.mean + h.std * shift, h.std * math.sqrt(var), None


def moments_of_sampler(r: policies.Resolved) -> tuple[float, float, float | None]:
    s = r.sampler
    if s.kind == "constant":
        return s.value, 0.0, s.value
    if s.kind == "uniform":
        return (s.low + s.high) / 2, r.effective_std, None
    if s.kind == "trunc_normal":
        z = _cdf(s.b) - _cdf(s.a)
        return s.mean + s.std * (_phi(s.a) - _phi(s.b)) / z, r.effective_std, None
    return s.mean, r.effective_std, None


def check_values(name: str, x: torch.Tensor, mean: float, sigma: float, constant: float | None,
                 zero_row: int | None, who: str) -> None:
    """``x`` follows the distribution: constants and the zero row exactly, the rest by its moments."""
    dtype = x.dtype
    x = x.detach().double()
    if zero_row is not None:
        assert torch.all(x[zero_row] == 0), f"{who}: {name} row {zero_row} is not zero"
        x = torch.cat([x[:zero_row], x[zero_row + 1:]])
    x = x.flatten()
    if constant is not None:
        want = torch.tensor(constant, dtype=dtype).double()
        assert torch.all(x == want), f"{who}: {name} is not all {constant}: {x[:4].tolist()}"
        return
    n = x.numel()
    if n < 2:
        assert abs(x.item() - mean) <= K * sigma, f"{who}: {name} = {x.item()} is far from N({mean}, {sigma})"
        return
    m, s = x.mean().item(), x.std().item()
    assert abs(m - mean) <= K * sigma / math.sqrt(n), f"{who}: {name} mean {m:.6g}, expected {mean:.6g} (sigma {sigma:.6g}, n {n})"
    tol = K * math.sqrt(1 / (2 * (n - 1)))
    assert abs(s / sigma - 1) <= tol, f"{who}: {name} std {s:.6g}, expected {sigma:.6g} (n {n}, tolerance {tol:.3g})"
