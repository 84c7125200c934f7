"""A model larger than the machine, probed through a depth-preserving, width-reduced proxy.

The proxy keeps every layer, the vocabulary, the head size and the number of experts, and divides
every width by a factor F: the hidden size, the feed-forward and expert sizes, the low-rank
projections, and the numbers of attention and key/value heads (so the head size is unchanged).

What carries over, and why: a layer's output std is std(W)·sqrt(fan_in)·std(x), so a fan-based
rule (xavier, kaiming, lecun, small-init...) gives the same per-layer gain at any width: it is
simply re-evaluated at the reduced width. A fixed std σ (BERT's 0.02) gives a gain of
σ·sqrt(fan_in), which a narrower model would shrink by sqrt(F); the proxy keeps the full model's gain
by multiplying those weights by sqrt(fan_in / fan_in') (linear, conv and expert weights only:
an embedding's output std does not depend on the width). Attention logits q·k/sqrt(head_dim) keep
their std because q, k and the head size do. Every output of a proxy says so.
"""
from __future__ import annotations

import math
from typing import Any

#: Widths divided by the factor (any that the config has, at any depth of nested configs).
WIDTHS = ("hidden_size", "d_model", "n_embd", "intermediate_size", "ffn_dim", "d_ff", "n_inner", "encoder_ffn_dim",
          "decoder_ffn_dim", "moe_intermediate_size", "shared_expert_intermediate_size", "q_lora_rank", "kv_lora_rank",
          "decoder_intermediate_size")
HEADS = ("num_attention_heads", "n_head", "encoder_attention_heads", "decoder_attention_heads", "num_heads")
KV_HEADS = ("num_key_value_heads", "num_kv_heads")
#: Kinds of tensors whose fixed std is scaled to keep the full model's gain.
GAIN_KINDS = ("linear", "conv", "expert", "router")


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def proxy_config(config: dict[str, Any], factor: int) -> tuple[dict[str, Any], list[str]]:
    """``config`` with every width divided by ``factor``, and what changed (``hidden_size 768 -> 192``)."""
    changes: list[str] = []

    def shrink(d: dict[str, Any], where: str) -> dict[str, Any]:
        out = dict(d)
        heads = next((d[k] for k in HEADS if _int(d.get(k))), None)
        hidden = next((d[k] for k in ("hidden_size", "d_model", "n_embd") if _int(d.get(k))), None)
        if heads and hidden and "head_dim" in d and d.get("head_dim") is None:
            out["head_dim"] = hidden // heads  # keep the head size explicit where the config allows it
        for k, v in d.items():
            if isinstance(v, dict):
                out[k] = shrink(v, f"{where}{k}.")
            elif k in WIDTHS and _int(v) and v >= factor:
                out[k] = v // factor
            elif k in HEADS and _int(v):
                if v % factor:
                    raise ValueError(f"probe: {where}{k} = {v} is not divisible by the proxy factor {factor}; "
                                     "choose a factor that divides the head count")
                out[k] = v // factor
            if out.get(k) != v and not isinstance(v, dict):
                changes.append(f"{where}{k} {v} -> {out[k]}")
        new_heads = next((out[k] for k in HEADS if _int(out.get(k))), None)
        for k in KV_HEADS:
            if _int(d.get(k)) and new_heads:
                kv = max(1, d[k] // factor)
                while new_heads % kv:
                    kv -= 1
                out[k] = kv
                if kv != d[k]:
                    changes.append(f"{where}{k} {d[k]} -> {kv}")
        return out

    return shrink(config, ""), changes


def gain_factors(full, proxy, rules) -> dict[str, float]:
    """{tensor name: factor} for the proxy's weights whose rule is a fixed std (not fan-based):
    sqrt(full fan_in / proxy fan_in), so std·sqrt(fan_in) is the full model's."""
    full_fans = {t.name: t.fan_in for t in full.tensors}
    out = {}
    for t in proxy.tensors:
        if t.kind not in GAIN_KINDS or t.param != "weight" or t.fan_in <= 0 or full_fans.get(t.name, 0) <= 0:
            continue
        if not rules(t):
            continue
        ratio = full_fans[t.name] / t.fan_in
        if ratio != 1:
            out[t.name] = math.sqrt(ratio)
    return out


def fixed_std(rule, t) -> bool:
    """Whether ``rule`` gives ``t`` a std that does not follow its fans (a fixed number)."""
    kind = rule.init.kind
    if kind == "recorded":
        h = t.hf_init
        if h is None or h.kind in ("constant", "computed"):
            return False
        return not h.source.startswith(("init.xavier", "init.kaiming", "constructor"))
    return kind in ("normal", "trunc_normal", "uniform")
