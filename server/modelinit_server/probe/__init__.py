"""The probe: is an init sound before the run? (docs/probe.md)

``probe(requests)`` fills the real model with each request's policy (its exact bytes, through
``init_module_``), runs one forward and backward pass on a synthetic batch made from the seed, and
returns per-layer measures and findings in plain words for each policy, on the same batch.

The package, top to bottom:

    report      the terminal table (rich) and the plot (matplotlib)
    check       probe() and coord_check(): the passes, each policy on the same batch
    result      ProbeResult and CoordResult, JSON in and out
    budget      the memory budget: the whole model, or the proxy that fits
    coord       the coordinate check: the model at several widths, K optimizer steps, slopes
    run         the model (float32, eager attention, filled), the batch, one measured pass
    findings    the measures read as sentences, with their thresholds
    proxy       a model larger than the machine: the width-reduced, depth-preserving proxy
    measures    what is measured, and how

May import the server layers below it (training, messages, architectures, core, engine).
"""
from __future__ import annotations

from .check import coord_check, probe
from .coord import CoordResult, CoordSeries
from .measures import LayerMeasures, ModelMeasures
from .result import ProbeResult, coord_from_json, coord_to_json, from_json, to_json

__all__ = ["CoordResult", "CoordSeries", "LayerMeasures", "ModelMeasures", "ProbeResult", "coord_check", "coord_from_json",
           "coord_to_json", "from_json", "probe", "to_json"]
