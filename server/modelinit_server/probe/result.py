"""What a probe and a coordinate check return (:class:`ProbeResult`, :class:`~.coord.CoordResult`),
and both as JSON, in and out."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from .coord import CoordResult, CoordSeries
from .measures import LayerMeasures, ModelMeasures

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
