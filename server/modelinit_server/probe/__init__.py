"""The probe: is an init sound before the run? (docs/probe.md)

``probe(requests)`` fills the real model with each request's policy (its exact bytes, through
``init_module_``), runs one forward and backward pass on a synthetic batch made from the seed, and
returns per-layer measures and findings in plain words for each policy, on the same batch.

The package, top to bottom:

    __init__    probe() and ProbeResult, coord_check() and CoordResult (JSON in and out)
    report      the terminal table (rich) and the plot (matplotlib)
    coord       the coordinate check: the model at several widths, K optimizer steps, slopes
    run         the model (float32, eager attention, filled), the batch, one measured pass
    findings    the measures read as sentences, with their thresholds
    proxy       a model larger than the machine: the width-reduced, depth-preserving proxy
    measures    what is measured, and how

May import the server layers below it (training, messages, architectures, core, engine).
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field

from ..core.planner import Request
from .coord import CoordResult, CoordSeries
from .findings import findings
from .measures import LayerMeasures, ModelMeasures
from .proxy import fixed_std, gain_factors, proxy_config
from .run import build, estimate_bytes, make_batch, measure

__all__ = ["CoordResult", "CoordSeries", "LayerMeasures", "ModelMeasures", "ProbeResult", "coord_check", "from_json",
           "probe", "to_json"]

#: Default batch: a few sequences of moderate length (enough elements for stable stds).
BATCH, SEQ = 4, 128


@dataclass(frozen=True)
class ProbeResult:
    """One policy's probe of one model."""

    model: str
    """Class and family, e.g. ``BertForMaskedLM (bert)``."""
    policy: str
    """The policy's label (preset name, file, or as given)."""
    seed: int
    batch: str
    """The synthetic batch, in words."""
    params: int
    measures: ModelMeasures
    findings: tuple[str, ...]
    proxy: str = ""
    """Empty for the whole model; else what the proxy is (every output says so)."""
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)


def probe(requests: list[Request], labels: list[str], batch: int = BATCH, seq: int = SEQ,
          memory_budget: int | None = None, proxy: int | None = None) -> list[ProbeResult]:
    """Probe each request (one per policy; same spec and seed) on the same synthetic batch.

    ``proxy``: None picks the whole model when it fits ``memory_budget`` (default: half the
    available memory), else the narrowest-reduction proxy that fits (:mod:`.proxy`); 1 asks for the
    whole model (refused, with the figures, when it does not fit); F > 1 a proxy with every width / F."""
    import torch

    if batch < 1 or seq < 1:
        raise ValueError(f"probe: batch and seq must be at least 1, got {batch} x {seq}")
    if proxy is not None and (isinstance(proxy, bool) or not isinstance(proxy, int) or proxy < 1):
        raise ValueError(f"probe: the proxy factor must be a whole number >= 1, got {proxy!r}")
    budget = memory_budget if memory_budget is not None else _available_bytes() // 2
    results = []
    for request, label in zip(requests, labels):
        spec = request.model
        factor = proxy if proxy is not None else _factor(spec, batch, seq, budget)
        need = _need(spec, batch, seq) if factor == 1 else 0
        if need > budget:
            raise ValueError(f"probe: {spec.architecture} ({spec.numel:,} parameters) needs about {need / 2**30:.1f} GiB "
                             f"for a {batch} x {seq} probe, more than the budget of {budget / 2**30:.1f} GiB; use a smaller "
                             "--batch / --seq, or a width-reduced proxy (--proxy F, or leave --proxy unset)")
        t0 = time.perf_counter()
        run_request, gains, what = request, {}, ""
        if factor > 1:
            run_request, gains, what = _proxy_request(request, factor)
        with torch.no_grad():
            model = build(run_request)
            for name, g in gains.items():
                try:
                    model.get_parameter(name).mul_(g)
                except AttributeError:  # stored converted (fused experts): left at the reduced width's std
                    pass
        data = make_batch(model, request.seed, batch, seq)
        measures = measure(model, data, run_request.model)
        del model
        results.append(ProbeResult(
            model=f"{spec.architecture} ({spec.family})", policy=label, seed=request.seed, batch=data.description,
            params=run_request.model.numel, measures=measures, findings=tuple(findings(measures)), proxy=what,
            seconds=time.perf_counter() - t0,
        ))
    return results


def _heads(spec) -> int:
    text = spec.config.get("text_config") if isinstance(spec.config.get("text_config"), dict) else spec.config
    return int(text.get("num_attention_heads") or text.get("n_head") or 1) if isinstance(text, dict) else 1


def _need(spec, batch: int, seq: int) -> int:
    return estimate_bytes(spec.numel, batch, seq, spec.hidden_size, spec.n_layers, _heads(spec))


def _factor(spec, batch: int, seq: int, budget: int) -> int:
    """1 when the whole model fits; else the smallest power of two whose proxy fits (and divides the heads)."""
    if _need(spec, batch, seq) <= budget:
        return 1
    heads = _heads(spec)
    factor = 2
    while factor <= heads and heads % factor == 0:
        if _need(_proxy_spec(spec, factor)[0], batch, seq) <= budget:  # built on the meta device: milliseconds
            return factor
        factor *= 2
    raise ValueError(f"probe: {spec.architecture} ({spec.numel:,} parameters) does not fit the budget of "
                     f"{budget / 2**30:.1f} GiB even as a proxy with every width / {factor // 2}; use a smaller --batch / --seq "
                     "or a larger --memory-budget")


def _proxy_spec(spec, factor: int):
    from ..architectures import from_config

    config, changes = proxy_config(dict(spec.config), factor)
    return from_config(config, spec.architecture), changes


def _proxy_request(request: Request, factor: int):
    """The proxy's request, the gain factors of its fixed-std weights, and what the proxy is, in words."""
    from ..core.policies import rules_for

    spec = request.model
    small, changes = _proxy_spec(spec, factor)
    rules = rules_for(request.policy, small)

    def fixed(t) -> bool:
        rule = next((r for r in rules if r.match.selects(t)), None)
        return rule is not None and fixed_std(rule, t)

    gains = gain_factors(spec, small, fixed)
    what = (f"depth-preserving proxy, every width / {factor} ({', '.join(changes[:6])}{', ...' if len(changes) > 6 else ''}); "
            f"{len(gains)} fixed-std weights scaled by sqrt(fan_in ratio) to keep the full model's per-layer gain; "
            f"{small.numel:,} of {spec.numel:,} parameters")
    return dataclasses.replace(request, model=small), gains, what


def _available_bytes() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def to_json(results: list[ProbeResult]) -> str:
    """The results as JSON (``from_json`` reads it back)."""
    return json.dumps({"probe": [dataclasses.asdict(r) for r in results]}, indent=1, allow_nan=True)


def from_json(text: str) -> list[ProbeResult]:
    doc = json.loads(text)
    out = []
    for r in doc["probe"]:
        m = dict(r["measures"])
        m["layers"] = tuple(LayerMeasures(**x) for x in m["layers"])
        m["nonfinite"] = tuple(m["nonfinite"])
        r = dict(r, measures=ModelMeasures(**m), findings=tuple(r["findings"]), notes=tuple(r.get("notes", ())))
        out.append(ProbeResult(**r))
    return out


def coord_check(requests: list[Request], labels: list[str], widths: list[int], steps: int, optimizer: str = "adam",
                lr: float | None = None, batch: int = BATCH, seq: int = SEQ,
                memory_budget: int | None = None) -> list[CoordResult]:
    """The coordinate check of each request (one per policy; same spec and seed) over ``widths``
    and ``steps`` (:mod:`.coord`); every request is validated before anything is built."""
    from . import coord

    budget = memory_budget if memory_budget is not None else _available_bytes() // 2
    for request in requests:
        coord.validate(request, widths, steps, optimizer, lr, batch, seq, budget)
    return [coord.coord_check(r, label, widths, steps, optimizer, lr, batch, seq, budget) for r, label in zip(requests, labels)]


def coord_to_json(results: list[CoordResult]) -> str:
    """Coordinate-check results as JSON (``coord_from_json`` reads it back); each series carries its verdict."""
    doc = []
    for r in results:
        d = dataclasses.asdict(r)
        for s, x in zip(r.series, d["series"]):
            x["verdict"] = s.verdict
        doc.append(d)
    return json.dumps({"coord_check": doc}, indent=1, allow_nan=True)


def coord_from_json(text: str) -> list[CoordResult]:
    out = []
    for r in json.loads(text)["coord_check"]:
        series = tuple(CoordSeries(x["module"], tuple(tuple(v) for v in x["values"]), tuple(x["slopes"]), tuple(x["verdicts"]))
                       for x in r["series"])
        r = dict(r, series=series, widths=tuple(r["widths"]), losses=tuple(tuple(v) for v in r["losses"]),
                 params=tuple(r["params"]), notes=tuple(r["notes"]))
        out.append(CoordResult(**r))
    return out
