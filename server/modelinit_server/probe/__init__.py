"""The probe: is an init sound before the run? (DESIGN §5b, docs/probe.md)

``probe(requests)`` fills the real model with each request's policy (its exact bytes, through
``init_module_``), runs one forward and backward pass on a synthetic batch made from the seed, and
returns per-layer measures and findings in plain words for each policy, on the same batch.

The package, top to bottom:

    __init__    probe() and ProbeResult (JSON in and out)
    report      the terminal table (rich) and the plot (matplotlib)
    run         the model (float32, eager attention, filled), the batch, one measured pass
    findings    the measures read as sentences, with their thresholds
    measures    what is measured, and how

May import the server layers below it (training, messages, architectures, core, engine).
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field

from ..core.planner import Request
from .findings import findings
from .measures import LayerMeasures, ModelMeasures
from .run import build, estimate_bytes, make_batch, measure

__all__ = ["LayerMeasures", "ModelMeasures", "ProbeResult", "from_json", "probe", "to_json"]

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

    @property
    def sound(self) -> bool:
        return not self.findings


def probe(requests: list[Request], labels: list[str], batch: int = BATCH, seq: int = SEQ,
          memory_budget: int | None = None) -> list[ProbeResult]:
    """Probe each request (one per policy; same spec and seed) on the same synthetic batch."""
    import torch

    if batch < 1 or seq < 1:
        raise ValueError(f"probe: batch and seq must be at least 1, got {batch} x {seq}")
    results = []
    for request, label in zip(requests, labels):
        spec = request.model
        text = spec.config.get("text_config") if isinstance(spec.config.get("text_config"), dict) else spec.config
        heads = int(text.get("num_attention_heads") or text.get("n_head") or 1) if isinstance(text, dict) else 1
        need = estimate_bytes(spec.numel, batch, seq, spec.hidden_size, spec.n_layers, heads)
        budget = memory_budget if memory_budget is not None else _available_bytes() // 2
        if need > budget:
            raise ValueError(f"probe: {spec.architecture} ({spec.numel:,} parameters) needs about {need / 2**30:.1f} GiB "
                             f"for a {batch} x {seq} probe, more than the budget of {budget / 2**30:.1f} GiB; use a smaller "
                             "--batch / --seq, or a width-reduced proxy")
        t0 = time.perf_counter()
        with torch.no_grad():
            model = build(request)
        data = make_batch(model, request.seed, batch, seq)
        measures = measure(model, data)
        del model
        results.append(ProbeResult(
            model=f"{spec.architecture} ({spec.family})", policy=label, seed=request.seed, batch=data.description,
            params=spec.numel, measures=measures, findings=tuple(findings(measures)), seconds=time.perf_counter() - t0,
        ))
    return results


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
