"""What ``plan`` and ``explain`` print: the plan's table or JSON, the groups against the Xavier/LeCun
references, and how a policy is named."""
from __future__ import annotations

import json
import os
from collections.abc import Sequence

from modelinit_wire.constants import MUP_BASE_WIDTH
from modelinit_wire.policy_file import looks_like_file, to_dict


def print_plan(plan, as_json: bool, tensors: bool = True) -> None:
    if as_json:
        from google.protobuf import json_format

        doc = json_format.MessageToDict(plan, preserving_proto_field_name=True)
        doc.setdefault("request", {})["policy"] = _policy_doc(plan)  # the policy-file format, as modelinit.json
        print(json.dumps(doc, indent=2))
        return
    print(f"{plan.architecture} ({plan.family}): {plan.total_params:,} parameters, {plan.total_bytes:,} bytes, "
          f"{sum(f.shard for f in plan.files)} shard(s); algorithm v{plan.algorithm_version}; fingerprint {plan.fingerprint}")
    if not tensors:
        rows: list[tuple[str, ...]] = [(f.name, f"{f.size:,}", str(f.tensors) if f.shard else "-") for f in plan.files]
        _print_table(("file", "bytes", "tensors"), rows)
        print(f"\n{plan.tensor_count:,} tensors in {len(plan.groups)} groups (--tensors lists them, `modelinit explain` shows the groups)")
        return
    rows = [(t.name, "x".join(map(str, t.shape)), t.init, f"{t.effective_std:.4g}", t.rule, plan.files[t.shard].name) for t in plan.tensors]
    _print_table(("tensor", "shape", "init", "eff. std", "rule", "file"), rows)


def _policy_doc(plan) -> dict:
    """The plan's (normalized) policy in the policy-file format: `--policy` takes it back."""
    from google.protobuf import json_format

    try:
        return to_dict(plan.request.policy)
    except ValueError:  # a server echoing what no policy file holds: show it as it came
        return json_format.MessageToDict(plan.request.policy, preserving_proto_field_name=True)


def _print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Columns left-aligned to their widest cell."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def explain_summary(plan) -> dict:
    """Totals over a PlanResponse's groups (what `explain` prints last)."""
    return {
        "total_params": plan.total_params,
        "groups": len(plan.groups),
        "warnings": sum(len(g.warnings) for g in plan.groups),
    }


def _group_label(g) -> str:
    return f"{g.rule} [{g.count} x {'x'.join(map(str, g.shape))}]"


def _ref(x: float, fmt: str) -> str:
    return format(x, fmt) if x else "-"  # 0 means "not applicable" (norms, biases, constants)


def policy_title(given: str | None, policy) -> str:
    """How ``explain`` names the policy: by what ``--policy`` gave (``given``), with what the
    request's ``policy`` message holds: ``policy hf-default``, ``policy file p.yaml (custom rules
    + preset gpt2)``, ``custom rules + preset gpt2``."""
    preset = policy.preset
    content = " + ".join(filter(None, ["custom rules" if policy.rules else "", f"preset {preset}" if preset else ""]))
    if given is not None and (looks_like_file(given) or os.path.isfile(given)):  # as model_policy() tells them apart
        return f"policy file {given} ({content or 'preset hf-default'})"
    return content if policy.rules else f"policy {preset or 'hf-default'}"


def print_explain(plan, as_json: bool, given_policy: str | None = None) -> None:
    if as_json:
        from google.protobuf import json_format

        # Fields at their default (0, empty) are printed too, so every group has the same keys, and
        # in proto field order (MessageToDict would put the defaulted ones last).
        def as_dict(g) -> dict:
            d = json_format.MessageToDict(g, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
            return {f.name: d[f.name] for f in g.DESCRIPTOR.fields}

        groups = [as_dict(g) for g in plan.groups]
        print(json.dumps({"policy": _policy_doc(plan), "groups": groups, "summary": explain_summary(plan)}, indent=2))
        return
    print(f"{plan.architecture} ({plan.family}), {policy_title(given_policy, plan.request.policy)}:")
    # the first tensor tells apart groups of one rule and shape (BERT's token-type embedding and NSP head)
    rows = [(g.rule, f"{g.count} x {'x'.join(map(str, g.shape))}", g.example, g.init, f"{g.effective_std:.4g}",
             _ref(g.xavier_std, ".4g"), _ref(g.lecun_std, ".4g"), _ref(g.ratio_lecun, ".3g"), g.formula) for g in plan.groups]
    _print_table(("rule", "tensors", "first tensor", "init", "eff. std", "xavier std", "lecun std", "std/lecun", "formula"),
                 rows)
    print("xavier std = sqrt(2/(fan_in+fan_out)); lecun std = 1/sqrt(fan_in); std/lecun = eff. std / lecun std "
          "(1: the fan-in scale; '-': not a fan-based tensor)")
    if plan.request.policy.preset == "mup":  # the half of µP the weights do not hold
        print(f"learning rates (µP; the optimizer's, not in the weights; `modelinit probe --widths` applies them, "
              f"docs/probe.md): Adam: hidden matrices LR · {MUP_BASE_WIDTH}/width, vector-like (embeddings, readout, "
              f"norms, biases) LR; SGD: hidden matrices LR, vector-like LR · width/{MUP_BASE_WIDTH}; the readout's "
              f"output x {MUP_BASE_WIDTH}/width in the forward pass")
    warnings = [f"{_group_label(g)}: {w}" for g in plan.groups for w in g.warnings]
    if warnings:
        print("\nwarnings:")
        for w in warnings:
            print(f"  {w}")
    s = explain_summary(plan)
    print(f"\n{s['total_params']:,} parameters in {s['groups']} groups; {s['warnings']} warning(s)")

