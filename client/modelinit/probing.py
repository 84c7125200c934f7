"""``modelinit.probe``: is an init sound before the run? (docs/probe.md)

The probe runs in this process (it builds the model, fills it and runs a forward and backward
pass), so it needs the server extra (the table and plot of ``modelinit probe``: the probe extra;
docs/install.md). This module
only builds the requests; ``modelinit.server_extra`` runs them.
"""
from __future__ import annotations

from typing import Any, Sequence

import grpc

from .errors import ModelInitError
from .request import PolicyArg, RequestOptions, Spec


def policy_label(policy: PolicyArg, index: int) -> str:
    """How a policy is named in tables, plots and JSON: its preset name or file, else ``policy[i]``."""
    if policy is None:
        return "hf-default"
    return policy if isinstance(policy, str) else f"policy[{index}]"


def probe(spec: Spec, *, policies: Sequence[PolicyArg] = ("hf-default",), seed: int = 0,
          architecture: str | None = None, batch: int = 4, seq: int = 128,
          memory_budget: int | None = None, proxy: int | None = None, widths: Sequence[int] | None = None,
          steps: int = 1, optimizer: str = "adam", lr: float | None = None) -> list[Any]:
    """Probe ``spec`` under each policy on the same synthetic batch (made from ``seed``): a list
    of ``ProbeResult`` (per-layer measures, findings in plain words), one per policy.

    ``policies``: presets, policy files or dicts, as ``init_model`` takes them. ``batch`` x
    ``seq``: the synthetic batch (sequences of token ids, or images at the config's size).
    ``memory_budget``: bytes the pass may take (default: half the available memory). ``proxy``:
    None probes the whole model when it fits, else a depth-preserving proxy with every width
    divided by the smallest power of two that fits (labelled in every output); 1 asks for the
    whole model (refused, with the figures, when it does not fit); F > 1 forces that factor.
    Results print with
    ``modelinit_server.probe.report.render`` and serialize with ``.to_json``.

    With ``widths``: the coordinate check instead (:func:`coord_check`, its results)."""
    from .server_extra import probe as run

    if widths is not None:
        if proxy is not None:
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, "--proxy: the coordinate check sets the widths itself; "
                                 "leave --proxy out with --widths")
        return coord_check(spec, policies=policies, widths=widths, steps=steps, optimizer=optimizer, lr=lr, seed=seed,
                           architecture=architecture, batch=batch, seq=seq, memory_budget=memory_budget)
    if not policies:
        raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, "policies: give at least one policy to probe")
    requests = [RequestOptions(seed=seed, policy=p, dtype="float32", architecture=architecture).request(spec) for p in policies]
    labels = [policy_label(p, i) for i, p in enumerate(policies)]
    return run(requests, labels, batch=batch, seq=seq, memory_budget=memory_budget, proxy=proxy)


def coord_check(spec: Spec, *, widths: Sequence[int], steps: int = 3, policies: Sequence[PolicyArg] = ("hf-default",),
                optimizer: str = "adam", lr: float | None = None, seed: int = 0, architecture: str | None = None,
                batch: int = 4, seq: int = 128, memory_budget: int | None = None) -> list[Any]:
    """The coordinate check (docs/probe.md): ``spec`` rebuilt at each of ``widths`` (hidden sizes;
    head size kept), filled with each policy's bytes for ``seed``, trained ``steps`` optimizer steps
    (``adam`` or ``sgd``, ``lr``; µP's per-parameter rates for the ``mup`` preset) on the probe's
    synthetic batch: one ``CoordResult`` per policy, with each module's mean |output| per step and
    width, its slope against width and a verdict (stable / growing / shrinking). Serialize with
    ``modelinit_server.probe.coord_to_json``; print with ``.report.render_coord``."""
    from .server_extra import coord_check as run

    if not policies:
        raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, "policies: give at least one policy to check")
    requests = [RequestOptions(seed=seed, policy=p, dtype="float32", architecture=architecture).request(spec) for p in policies]
    labels = [policy_label(p, i) for i, p in enumerate(policies)]
    return run(requests, labels, widths=list(widths), steps=steps, optimizer=optimizer, lr=lr, batch=batch, seq=seq,
               memory_budget=memory_budget)
