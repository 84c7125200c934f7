"""How much of the machine a probe may take, and what runs in it: the whole model when it fits the
memory budget, else the narrowest depth-preserving proxy that does (:mod:`.proxy`)."""
from __future__ import annotations

import dataclasses

from ..core.planner import Request
from .proxy import fixed_std, gain_factors, proxy_config
from .run import estimate_bytes


def head_count(spec) -> int:
    """The model's attention heads (a composite model's text model's)."""
    text = spec.config.get("text_config") if isinstance(spec.config.get("text_config"), dict) else spec.config
    return int(text.get("num_attention_heads") or text.get("n_head") or 1) if isinstance(text, dict) else 1


def bytes_needed(spec, batch: int, seq: int) -> int:
    """About the memory a probe of ``spec`` on a ``batch`` x ``seq`` batch takes."""
    return estimate_bytes(spec.numel, batch, seq, spec.hidden_size, spec.n_layers, head_count(spec))


def proxy_factor(spec, batch: int, seq: int, budget: int) -> int:
    """1 when the whole model fits; else the smallest power of two whose proxy fits (and divides the heads)."""
    if bytes_needed(spec, batch, seq) <= budget:
        return 1
    n_heads = head_count(spec)
    factor = 2
    while factor <= n_heads and n_heads % factor == 0:
        if bytes_needed(proxy_spec(spec, factor)[0], batch, seq) <= budget:  # built on the meta device: milliseconds
            return factor
        factor *= 2
    raise ValueError(f"probe: {spec.architecture} ({spec.numel:,} parameters) does not fit the budget of "
                     f"{budget / 2**30:.1f} GiB even as a proxy with every width / {factor // 2}; use a smaller --batch / --seq "
                     "or a larger --memory-budget")


def proxy_spec(spec, factor: int):
    from ..architectures import from_config

    config, changes = proxy_config(dict(spec.config), factor)
    return from_config(config, spec.architecture), changes


def proxy_request(request: Request, factor: int):
    """The proxy's request, the gain factors of its fixed-std weights, and what the proxy is, in words."""
    from ..core.policies import rules_for

    spec = request.model
    small, changes = proxy_spec(spec, factor)
    rules = rules_for(request.policy, small)

    def fixed(t) -> bool:
        rule = next((r for r in rules if r.match.selects(t)), None)
        return rule is not None and fixed_std(rule, t)

    gains = gain_factors(spec, small, fixed)
    what = (f"depth-preserving proxy, every width / {factor} ({', '.join(changes[:6])}{', ...' if len(changes) > 6 else ''}); "
            f"{len(gains)} fixed-std weights scaled by sqrt(fan_in ratio) to keep the full model's per-layer gain; "
            f"{small.numel:,} of {spec.numel:,} parameters")
    return dataclasses.replace(request, model=small), gains, what


def available_bytes() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30
