"""The coordinate check (issue 45, docs/probe.md): does each module's output keep its scale as the
model widens, at init and over the first optimizer steps?

The model of the spec is rebuilt at each width (hidden size set, head size kept: the numbers of
attention and key/value heads scaled so their ratio holds; the feed-forward size scaled in
proportion), filled with the policy's bytes for the seed (:func:`.run.build`), and trained K steps
on the probe's seeded synthetic batch. Per module and step t (t = 1 is the forward pass at init,
t = k the one after k - 1 steps) it records the mean absolute value of the module's output
(microsoft/mup's ``get_coord_data``: ``x.abs().mean()`` by forward hooks; a tuple's first
element), the attention logits of each layer (centered per row), the output logits and the loss.

Then, per module and step, the least-squares slope of log(scale) against log(width), read as a
verdict (:func:`threshold`).

µP (the ``mup`` preset) needs more than its init: the learning rates and the readout multiplier,
which the policy language does not express. The check applies them here, as microsoft/mup's
``MuReadout`` and ``MuAdam`` / ``MuSGD`` do (:func:`lr_groups`).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from modelinit_wire.constants import MUP_BASE_WIDTH

from ..architectures import meta_models
from ..core.planner import Request
from .run import Batch, _attentions, build, estimate_bytes, make_batch, stacks

OPTIMIZERS = ("adam", "sgd")
#: The learning rate when none is given, per optimizer.
DEFAULT_LR = {"adam": 1e-3, "sgd": 1e-1}

_HIDDEN = ("hidden_size", "n_embd", "d_model")
_HEADS = ("num_attention_heads", "n_head")
_KV = ("num_key_value_heads", "num_kv_heads")
_FFN = ("intermediate_size", "n_inner", "ffn_dim", "d_ff")
#: Widths the check does not know how to scale: a config that sets one is refused, naming it.
_REFUSED = ("moe_intermediate_size", "shared_expert_intermediate_size", "q_lora_rank", "kv_lora_rank",
            "text_config", "vision_config", "encoder_ffn_dim", "decoder_ffn_dim", "num_experts", "n_routed_experts",
            "num_local_experts")


@dataclass(frozen=True)
class CoordSeries:
    """One module's scale: ``values[t - 1][i]`` at step t and ``widths[i]``; ``slopes[t - 1]`` and
    ``verdicts[t - 1]`` per step."""

    module: str
    values: tuple[tuple[float, ...], ...]
    slopes: tuple[float, ...]
    verdicts: tuple[str, ...]

    @property
    def verdict(self) -> str:
        """The first step's verdict that is not ``stable`` (``growing`` / ``shrinking``), else ``stable``."""
        return next((v for v in self.verdicts if v in ("growing", "shrinking")), "stable")


@dataclass(frozen=True)
class CoordResult:
    """One policy's coordinate check of one model over widths and steps."""

    model: str
    policy: str
    seed: int
    batch: str
    widths: tuple[int, ...]
    steps: int
    optimizer: str
    lr: float
    lr_rule: str
    """The learning-rate rule, in words (one LR for every parameter, or µP's)."""
    threshold: float
    """|slope| above which a module is growing / shrinking (:func:`threshold`)."""
    series: tuple[CoordSeries, ...]
    """In forward order: every module, then ``<layer>.attn_logits``, ``logits``."""
    losses: tuple[tuple[float, ...], ...]
    """``losses[t - 1][i]``: the loss of the forward pass at step t, width i."""
    first_problem: str = ""
    """Where it first goes wrong (step, then forward order), in words; empty when every series is stable."""
    params: tuple[int, ...] = ()
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)


def threshold(n_widths: int) -> float:
    """|slope| above which a series is growing or shrinking: 0.5 / sqrt(n - 1) for n widths (0.5 for
    2, 0.35 for 3, 0.29 for 4, 0.25 for 5).

    Why: the slopes that matter are standard parametrization's 0.5 (a fixed std at init: the output
    of W x grows as sqrt(width)) and 1 (after an Adam step, ΔW x sums width correlated terms); µP's
    is 0. Two widths give one ratio, which any finite-width wobble moves, so the bar sits at 0.5;
    the least-squares slope of n widths averages n - 1 ratios, so its noise, and the bar, fall as
    1 / sqrt(n - 1)."""
    return 0.5 / math.sqrt(max(n_widths - 1, 1))


def slope(widths: tuple[int, ...], values: tuple[float, ...]) -> float:
    """Least-squares slope of log(value) against log(width); 0 when every value is 0 (a zero-init
    readout at init), nan when only some are or one is not finite."""
    if all(v == 0 for v in values):
        return 0.0
    if any(not (v > 0 and math.isfinite(v)) for v in values):
        return float("nan")
    xs = [math.log(w) for w in widths]
    ys = [math.log(v) for v in values]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else float("nan")


def verdict(s: float, bar: float) -> str:
    if math.isnan(s):
        return "undefined"
    return "growing" if s > bar else "shrinking" if s < -bar else "stable"


def widened_config(config: dict[str, Any], width: int) -> dict[str, Any]:
    """``config`` at hidden size ``width``: head size kept (heads scaled, key/value heads in the same
    ratio), feed-forward size scaled in proportion. A ValueError naming the flag or field otherwise."""
    for k in _REFUSED:
        if config.get(k):
            raise ValueError(f"--widths: the config's {k} ({config[k]!r}) is a width the coordinate check does not "
                             "scale; check a dense text config (hidden size, heads, feed-forward size)")
    hk = next((k for k in _HIDDEN if isinstance(config.get(k), int)), None)
    nk = next((k for k in _HEADS if isinstance(config.get(k), int)), None)
    if hk is None or nk is None:
        raise ValueError(f"--widths: the config has no {'hidden size (' + ', '.join(_HIDDEN) + ')' if hk is None else 'head count (' + ', '.join(_HEADS) + ')'}"
                         "; the coordinate check widens a transformer by its hidden size and heads")
    hidden, heads = config[hk], config[nk]
    head_dim = config.get("head_dim") or hidden // heads
    if head_dim * heads != hidden and not config.get("head_dim"):
        raise ValueError(f"--widths: the config's {hk} {hidden} is not {nk} {heads} x a head size; give head_dim")
    if width % head_dim:
        raise ValueError(f"--widths: {width} is not a multiple of the head size {head_dim} ({hk} {hidden} / {nk} {heads}); "
                         f"use multiples of {head_dim}")
    out = dict(config)
    out[hk] = width
    out[nk] = width // head_dim
    if config.get("head_dim"):
        out["head_dim"] = head_dim
    kk = next((k for k in _KV if isinstance(config.get(k), int)), None)
    if kk is not None:
        ratio, rest = divmod(heads, config[kk])
        if rest or out[nk] % ratio:
            raise ValueError(f"--widths: {width} gives {out[nk]} heads, which the {config[kk]}:{heads} key/value-head "
                             f"ratio ({kk}) does not divide; use widths that are multiples of {head_dim * ratio}")
        out[kk] = out[nk] // ratio
    for k in _FFN:
        if isinstance(config.get(k), int) and config[k] > 0:
            out[k] = max(1, round(config[k] * width / hidden))
    return out


def _spec(request: Request, width: int):
    from ..architectures import from_config

    spec = request.model
    return from_config(widened_config(dict(spec.config), width), spec.architecture)


def is_mup(request: Request) -> bool:
    return request.policy.effective_preset == "mup"


def lr_groups(model, width: int, lr: float, optimizer: str, mup: bool, wide_model=None) -> tuple[list[dict], str]:
    """The optimizer's parameter groups and the rule in words.

    Every policy but ``mup``: one LR for every parameter. ``mup`` (microsoft/mup's MuAdam / MuSGD,
    width_mult = width / 256): a parameter with two dimensions that grow with width (hidden matrices)
    is matrix-like, with one (embeddings, the readout, norms, biases) vector-like. Adam: matrix-like
    LR / width_mult, the rest LR. SGD: vector-like LR · width_mult, matrix-like LR (both of their
    dimensions grow together: mup's fan-in / fan-out ratio is 1). Which dimensions grow is read off
    ``wide_model``, the same model at twice the width (mup's ``set_base_shapes``)."""
    params = list(model.named_parameters())
    if not mup:
        return [{"params": [p for _, p in params], "lr": lr}], f"{optimizer}, one LR {lr:g} for every parameter"
    mult = width / MUP_BASE_WIDTH
    wide = dict(wide_model.named_parameters())
    matrix, vector, fixed = [], [], []
    for name, p in params:
        other = wide[name].shape
        grows = sum(1 for a, b in zip(p.shape, other) if a != b)
        (matrix if grows >= 2 else vector if grows == 1 else fixed).append(p)
    if optimizer == "adam":
        groups = [{"params": matrix, "lr": lr / mult}, {"params": vector + fixed, "lr": lr}]
        rule = (f"µP (MuAdam): hidden matrices LR {lr:g} · {MUP_BASE_WIDTH}/width, vector-like (embeddings, readout, norms, "
                f"biases) {lr:g}; readout output x {MUP_BASE_WIDTH}/width")
    else:
        groups = [{"params": matrix + fixed, "lr": lr}, {"params": vector, "lr": lr * mult}]
        rule = (f"µP (MuSGD): hidden matrices LR {lr:g}, vector-like (embeddings, readout, norms, biases) "
                f"{lr:g} · width/{MUP_BASE_WIDTH}; readout output x {MUP_BASE_WIDTH}/width")
    return [g for g in groups if g["params"]], rule


def _first_tensor(x):
    import torch

    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (tuple, list)) and x and isinstance(x[0], torch.Tensor):
        return x[0]
    return None


def _attn_logit_scale(probs, allowed) -> float:
    """Mean |logit - the row's mean logit| over the keys each query attends (``allowed``, read at
    init, when no probability has underflowed), from the attention probabilities (log p is the
    logit up to the row's constant). Rows with one key are left out."""
    import torch

    from .measures import _TINY

    p = probs.detach().to(torch.float64)
    logp = torch.where(allowed, p.clamp_min(_TINY).log(), torch.zeros_like(p))
    n = allowed.sum(-1).to(torch.float64)
    mean = logp.sum(-1, keepdim=True) / n.clamp_min(1).unsqueeze(-1)
    dev = torch.where(allowed, (logp - mean).abs(), torch.zeros_like(p)).sum(-1) / n.clamp_min(1)
    several = (n > 1).expand_as(dev)
    value = float((dev * several).sum() / several.sum().clamp_min(1))
    return value if value >= 1e-6 else 0.0


def _run_width(request: Request, spec, width: int, batch: int, seq: int, steps: int, optimizer: str, lr: float):
    """({series name: [scale per step]}, names in forward order, [loss per step], rule, parameters, batch)."""
    import torch

    run_request = dataclasses.replace(request, model=spec)
    with torch.no_grad():
        model = build(run_request)
    data: Batch = make_batch(model, request.seed, batch, seq)
    mup = is_mup(request)
    wide = None
    if mup:
        wide = meta_models.meta_model(widened_config(dict(request.model.config), 2 * width), spec.architecture)
    groups, rule = lr_groups(model, width, lr, optimizer, mup, wide)
    del wide
    opt = torch.optim.Adam(groups, lr=lr) if optimizer == "adam" else torch.optim.SGD(groups, lr=lr)
    handles = []
    readout = model.get_output_embeddings()
    inputs = model.get_input_embeddings()
    tied = readout is not None and inputs is not None and readout.weight is inputs.weight
    if mup:
        if readout is None:
            raise ValueError(f"--policy mup: {type(model).__name__} has no output embeddings for µP's readout multiplier")
        factor = MUP_BASE_WIDTH / width
        handles.append(readout.register_forward_hook(lambda m, a, out: out * factor))
    records: dict[str, list[float]] = {}
    order: list[str] = []
    current: dict[str, float] = {}

    def hook(name: str):
        def f(module, args, output):
            x = _first_tensor(output)
            if x is not None and x.is_floating_point() and name not in current:
                current[name] = float(x.detach().abs().mean())
        return f

    for name, module in model.named_modules():
        if name:
            handles.append(module.register_forward_hook(hook(name)))
    blocks = stacks(model)
    allowed: dict[tuple[str, int], Any] = {}
    losses = []
    try:
        for t in range(1, steps + 1):
            current.clear()
            kwargs: dict[str, Any] = dict(data.inputs, output_attentions=True)
            if data.labels is not None:
                kwargs["labels"] = data.labels
            with meta_models.quiet():
                out = model(**kwargs)
            if data.labels is not None and getattr(out, "loss", None) is not None:
                loss = out.loss
            else:
                last = getattr(out, "last_hidden_state", None)
                loss = 0.5 * (last if last is not None else out.logits).float().pow(2).mean()
            for path, probs in _attentions(out, blocks).items():
                for i, pr in enumerate(probs):
                    if pr is None:
                        continue
                    if (path, i) not in allowed:
                        allowed[(path, i)] = pr.detach() > 0
                    current[f"{path}.{i}.attn_logits"] = _attn_logit_scale(pr, allowed[(path, i)])
            logits = getattr(out, "logits", None)
            if logits is not None:
                current["logits"] = float(logits.detach().abs().mean())
            losses.append(float(loss.detach()))
            for name, v in current.items():
                if name not in records:
                    order.append(name)
                records.setdefault(name, []).append(v)
            if t < steps:
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
    finally:
        for h in handles:
            h.remove()
    n = sum(p.numel() for p in model.parameters())
    return records, order, losses, rule, n, data.description, tied


def validate(request: Request, widths: list[int], steps: int, optimizer: str, lr: float | None, batch: int, seq: int,
             budget: int) -> list:
    """The spec at each width, or a ValueError naming the flag and the fix (before anything is built)."""
    if not isinstance(widths, (list, tuple)) or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in widths):
        raise ValueError(f"--widths: give positive whole numbers (hidden sizes), got {widths!r}")
    if len(set(widths)) < 2:
        raise ValueError(f"--widths: a coordinate check needs at least two different widths, got {list(widths)}; "
                         "give e.g. --widths 128,256,512,1024")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"--steps: must be at least 1 (t = 1 is the init), got {steps!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"--optimizer: unknown optimizer {optimizer!r}; use one of: {', '.join(OPTIMIZERS)}")
    if lr is not None and not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"--lr: must be a positive number, got {lr!r}")
    if batch < 1 or seq < 1:
        raise ValueError(f"--batch / --seq: must be at least 1, got {batch} x {seq}")
    specs = [_spec(request, w) for w in sorted(set(widths))]
    widest = specs[-1]
    heads = next((int(widest.config[k]) for k in _HEADS if isinstance(widest.config.get(k), int)), 1)
    need = estimate_bytes(widest.numel, batch, seq, widest.hidden_size, widest.n_layers, heads) + 8 * widest.numel
    if need > budget:
        raise ValueError(f"--widths: width {max(widths)} ({widest.numel:,} parameters) needs about {need / 2**30:.1f} GiB "
                         f"for {batch} x {seq} tokens and {optimizer}, more than the budget of {budget / 2**30:.1f} GiB; "
                         "use smaller --widths, --batch or --seq, or a larger --memory-budget")
    return specs


def coord_check(request: Request, label: str, widths: list[int], steps: int, optimizer: str = "adam",
                lr: float | None = None, batch: int = 4, seq: int = 128, budget: int = 8 << 30) -> CoordResult:
    """The coordinate check of ``request`` (its spec, policy and seed) over ``widths`` and ``steps``."""
    import time

    t0 = time.perf_counter()
    specs = validate(request, widths, steps, optimizer, lr, batch, seq, budget)
    lr = float(lr) if lr is not None else DEFAULT_LR[optimizer]
    ws = tuple(sorted(set(widths)))
    per_width, order, losses, params = [], [], [], []
    rule, desc, tied = "", "", False
    for w, spec in zip(ws, specs):
        rec, names, loss, rule, n, desc, tied = _run_width(request, spec, w, batch, seq, steps, optimizer, lr)
        per_width.append(rec)
        order = order or names
        losses.append(loss)
        params.append(n)
    bar = threshold(len(ws))
    names = [x for x in order if all(x in r and len(r[x]) == steps for r in per_width)]
    series = []
    for name in names:
        values = tuple(tuple(r[name][t] for r in per_width) for t in range(steps))
        slopes = tuple(slope(ws, v) for v in values)
        series.append(CoordSeries(name, values, slopes, tuple(verdict(s, bar) for s in slopes)))
    first = ""
    for t in range(steps):
        bad = next((s for s in series if s.verdicts[t] in ("growing", "shrinking")), None)
        if bad is not None:
            first = (f"{bad.module} is {bad.verdicts[t]} with width at step {t + 1} (slope {bad.slopes[t]:.2f}, "
                     f"|slope| > {bar:.2f})")
            break
    spec = request.model
    notes = []
    if is_mup(request):
        notes.append("µP's learning rates and readout multiplier are applied by the check (the policy holds the init "
                     "only); the attention scale stays 1/sqrt(head size), a constant here since the head size is kept")
        if tied:
            notes.append("tied embeddings: the readout is the embedding (vector-like, N(0, sigma)), not µP's zero readout: "
                         "the logits do not follow µP; untie them (tie_word_embeddings: false) to check µP")
    return CoordResult(
        model=f"{spec.architecture} ({spec.family})", policy=label, seed=request.seed, batch=desc, widths=ws,
        steps=steps, optimizer=optimizer, lr=lr, lr_rule=rule, threshold=bar, series=tuple(series),
        losses=tuple(tuple(losses[i][t] for i in range(len(ws))) for t in range(steps)), first_problem=first,
        params=tuple(params), seconds=time.perf_counter() - t0, notes=tuple(notes),
    )
