"""The two passes the probe package runs: :func:`probe` (one measured forward and backward pass of
each policy's filled model) and :func:`coord_check` (the model at several widths over a few steps)."""
from __future__ import annotations

import time

from ..core.planner import Request
from .budget import available_bytes, bytes_needed, proxy_factor, proxy_request
from .coord import CoordResult
from .findings import findings
from .result import BATCH, SEQ, ProbeResult
from .run import build, make_batch, measure


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
    budget = memory_budget if memory_budget is not None else available_bytes() // 2
    results = []
    for request, label in zip(requests, labels):
        spec = request.model
        factor = proxy if proxy is not None else proxy_factor(spec, batch, seq, budget)
        need = bytes_needed(spec, batch, seq) if factor == 1 else 0
        if need > budget:
            raise ValueError(f"probe: {spec.architecture} ({spec.numel:,} parameters) needs about {need / 2**30:.1f} GiB "
                             f"for a {batch} x {seq} probe, more than the budget of {budget / 2**30:.1f} GiB; use a smaller "
                             "--batch / --seq, or a width-reduced proxy (--proxy F, or leave --proxy unset)")
        t0 = time.perf_counter()
        run_request, gains, what = request, {}, ""
        if factor > 1:
            run_request, gains, what = proxy_request(request, factor)
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


def coord_check(requests: list[Request], labels: list[str], widths: list[int], steps: int, optimizer: str = "adam",
                lr: float | None = None, batch: int = BATCH, seq: int = SEQ,
                memory_budget: int | None = None) -> list[CoordResult]:
    """The coordinate check of each request (one per policy; same spec and seed) over ``widths``
    and ``steps`` (:mod:`.coord`); every request is validated before anything is built."""
    from . import coord

    budget = memory_budget if memory_budget is not None else available_bytes() // 2
    for request in requests:
        coord.validate(request, widths, steps, optimizer, lr, batch, seq, budget)
    return [coord.coord_check(r, label, widths, steps, optimizer, lr, batch, seq, budget) for r, label in zip(requests, labels)]
