"""The probe's results for people: a terminal table (rich) and a plot (matplotlib), one line per policy.

Both are imported only here, when a report is asked for.
"""
from __future__ import annotations

import math
import shutil
from typing import Any

from .coord import CoordResult
from .result import ProbeResult

#: (field, title, log scale) of each per-layer panel of the plot.
PANELS = (
    ("residual_std", "residual stream std", True),
    ("update_ratio", "std(layer update) / std(residual in)", True),
    ("attn_branch", "std(attention branch) / std(residual in)", True),
    ("mlp_branch", "std(MLP branch) / std(residual in)", True),
    ("grad_norm", "weight-gradient norm", True),
    ("hidden_grad_std", "std of dLoss/d(layer output)", True),
    ("attn_logit_std", "attention logit std", False),
    ("attn_entropy", "attention entropy / uniform's", False),
)


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return f"{x:.4g}"
    return str(x)


def render(results: list[ProbeResult], console=None) -> None:
    """Per policy: the per-layer table and the findings; then, for several policies, a summary."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=max(shutil.get_terminal_size((160, 24)).columns, 140))
    for r in results:
        m = r.measures
        title = f"{r.model}, policy {r.policy}, seed {r.seed}: {r.batch}" + (f" [PROXY: {r.proxy}]" if r.proxy else "")
        table = Table(title=title, title_justify="left")
        for col in ("stack", "layer", "residual std", "update ratio", "attn branch", "mlp branch", "grad norm", "dL/dh std",
                    "attn logit std", "attn entropy", "attn max p"):
            table.add_column(col, justify="right")
        for x in m.layers:
            table.add_row(x.stack or "-", str(x.index), _fmt(x.residual_std), _fmt(x.update_ratio), _fmt(x.attn_branch),
                          _fmt(x.mlp_branch), _fmt(x.grad_norm), _fmt(x.hidden_grad_std), _fmt(x.attn_logit_std),
                          _fmt(x.attn_entropy), _fmt(x.attn_max_prob))
        console.print(table)
        ref = f" vs ln(classes) {m.reference_loss:.4g}" if m.reference_loss is not None else ""
        console.print(f"loss {_fmt(m.loss)}{ref}; output logit std {_fmt(m.logit_std)}; "
                      f"embedding output std {_fmt(m.embedding_std)}; {r.params:,} parameters; {r.seconds:.1f} s")
        if r.findings:
            for f in r.findings:
                console.print(f"[bold red]finding:[/] {f}")
        else:
            console.print("[green]no findings[/]: gradients reach the first layer, activations stay bounded, attention "
                          "is not saturated, the loss starts near uniform")
    if len(results) > 1:
        summary = Table(title="policies compared on the same batch", title_justify="left")
        for col in ("policy", "loss", "logit std", "grad first/last", "residual last/first", "min attn entropy", "findings"):
            summary.add_column(col, justify="right")
        for r in results:
            summary.add_row(r.policy, *[_fmt(v) for v in _summary(r)], str(len(r.findings)))
        console.print(summary)


def _summary(r: ProbeResult) -> tuple[float | None, ...]:
    layers = r.measures.layers
    stack = [x for x in layers if x.stack == layers[0].stack] if layers else []
    grad = stack[0].grad_norm / stack[-1].grad_norm if stack and stack[-1].grad_norm > 0 else None
    growth = stack[-1].residual_std / stack[0].residual_std if stack and stack[0].residual_std > 0 else None
    ent = [x.attn_entropy for x in layers if x.attn_entropy is not None]
    return r.measures.loss, r.measures.logit_std, grad, growth, min(ent) if ent else None


def plot(results: list[ProbeResult], path: str) -> None:
    """Per-layer curves of each measure, one line per policy (and stack), written as a PNG."""
    import matplotlib.pyplot as plt

    fig = figure(results)
    fig.savefig(path, dpi=100)
    plt.close(fig)


#: A log panel whose values span less than this factor is widened to it: a flat series (a Post-LN
#: model's residual std is ~1 at every layer) would otherwise get ticks all labelled alike.
MIN_LOG_SPAN = 4.0


def figure(results: list[ProbeResult]):
    """The plot's matplotlib figure (2 x 4 panels); the caller saves or closes it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(20, 8))
    for ax, (name, title, log) in zip(axes.flat, PANELS):
        shown: list[float] = []
        for r in results:
            stacks: dict[str, list] = {}
            for x in r.measures.layers:
                stacks.setdefault(x.stack, []).append(x)
            for stack, layers in stacks.items():
                ys = [getattr(x, name) for x in layers]
                if all(y is None for y in ys):
                    continue
                ys = [float("nan") if y is None or (log and y <= 0) else y for y in ys]
                shown += [y for y in ys if math.isfinite(y)]
                label = r.policy + (f" ({stack})" if stack else "")
                ax.plot([x.index for x in layers], ys, marker="o", label=label)
        ax.set_title(title)
        ax.set_xlabel("layer")
        if log:
            ax.set_yscale("log")
            if shown and max(shown) / min(shown) < MIN_LOG_SPAN:
                middle = math.sqrt(max(shown) * min(shown))
                ax.set_ylim(middle / math.sqrt(MIN_LOG_SPAN), middle * math.sqrt(MIN_LOG_SPAN))
        ax.grid(True, alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    first = results[0]
    proxy = f" — PROXY: {first.proxy}" if first.proxy else ""
    fig.suptitle(f"modelinit probe: {first.model}, seed {first.seed}, {first.batch}{proxy}")
    fig.tight_layout()
    return fig


def render_coord(results: list[CoordResult], console=None) -> None:
    """Per policy: each series' slope of log(scale) vs log(width) at each step and its verdict; then
    where it first goes wrong."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=max(shutil.get_terminal_size((160, 24)).columns, 120))
    for r in results:
        title = (f"coordinate check: {r.model}, policy {r.policy}, seed {r.seed}, widths {','.join(map(str, r.widths))}, "
                 f"{r.steps} step(s); {r.lr_rule}; {r.batch}")
        table = Table(title=title, title_justify="left")
        table.add_column("module", justify="left")
        for t in range(1, r.steps + 1):
            table.add_column(f"slope t={t}", justify="right")
        table.add_column(f"scale t={r.steps}", justify="right")
        table.add_column("verdict", justify="left")
        for s in r.series:
            colour = {"growing": "red", "shrinking": "yellow"}.get(s.verdict, "green")
            table.add_row(s.module, *[f"{x:.2f}" for x in s.slopes],
                          " ".join(_fmt(v) for v in s.values[-1]), f"[{colour}]{s.verdict}[/]")
        console.print(table)
        console.print("loss per step (widest width): " + " ".join(_fmt(step[-1]) for step in r.losses) +
                      f"; |slope| > {r.threshold:.2f} is growing / shrinking ({len(r.widths)} widths); {r.seconds:.1f} s")
        for note in r.notes:
            console.print(f"note: {note}")
        if r.first_problem:
            console.print(f"[bold red]first:[/] {r.first_problem}")
        else:
            console.print("[green]stable[/]: every module's scale stays within the threshold at every step")


def plot_coord(results: list[CoordResult], path: str) -> None:
    """The coord-check plot (microsoft/mup's ``plot_coord_data``): per policy one row, one panel per
    step, one line per module, scale against width, log-log; written as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = max(r.steps for r in results)
    fig, axes = plt.subplots(len(results), steps, figsize=(4 * steps + 1, 3.6 * len(results)), squeeze=False)
    for row, r in zip(axes, results):
        for t, ax in enumerate(row):
            if t >= r.steps:
                ax.axis("off")
                continue
            for s in r.series:
                ys = [v if v > 0 else float("nan") for v in s.values[t]]
                ax.plot(r.widths, ys, marker="o", linewidth=1,
                        color="red" if s.verdicts[t] == "growing" else "orange" if s.verdicts[t] == "shrinking" else None,
                        alpha=1.0 if s.verdicts[t] in ("growing", "shrinking") else 0.5)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{r.policy}: t = {t + 1}" + (" (init)" if t == 0 else ""))
            ax.set_xlabel("width")
            if t == 0:
                ax.set_ylabel("mean |output|")
            ax.grid(True, alpha=0.3)
    first = results[0]
    fig.suptitle(f"coordinate check: {first.model}, seed {first.seed}, {first.optimizer} lr {first.lr:g} "
                 "(red: growing, orange: shrinking)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
