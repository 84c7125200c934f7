"""Megatron-Core's own layout rules, as the Megatron tests apply them to a Hugging Face folder and
to the ranks' shares, written from Megatron's rules and never from ``init_module_``'s map:

* attention: q, k and v concatenated per query group (each group's query heads, then its key
  head, then its value head: Megatron's ``linear_qkv``);
* a gated MLP's ``linear_fc1`` is ``[gate; up]``, its ``linear_fc2`` the down projection;
* tensor parallel: a column-parallel weight is split by rows, a row-parallel one by columns, and a
  gated ``linear_fc1`` holds ``[gate_r; up_r]`` on rank r.
"""
from __future__ import annotations

import torch


def qkv_per_group(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int, head_dim: int) -> torch.Tensor:
    """Megatron's ``linear_qkv`` weight (or bias) from Hugging Face's q, k and v projections."""
    rest = q.shape[1:]
    return torch.cat([q.view(groups, -1, *rest), k.view(groups, head_dim, *rest), v.view(groups, head_dim, *rest)],
                     dim=1).reshape(-1, *rest)


def gated_mlp(files: dict, prefix: str, names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")) -> dict:
    """``linear_fc1.weight`` (``[gate; up]``) and ``linear_fc2.weight`` of the Hugging Face MLP
    whose tensors start with ``prefix`` (``names``: its gate, up and down projections)."""
    gate, up, down = names
    return {"linear_fc1.weight": torch.cat([files[f"{prefix}{gate}.weight"], files[f"{prefix}{up}.weight"]]),
            "linear_fc2.weight": files[f"{prefix}{down}.weight"]}


def tp_whole(name: str, parts: list[torch.Tensor], rows: tuple[str, ...], columns: tuple[str, ...],
             gated: bool = True) -> torch.Tensor:
    """The whole tensor ``name`` from its tensor-parallel ranks' ``parts`` (in rank order):
    concatenated by rows for a name ending in ``rows``, by columns for ``columns``, a gated
    ``linear_fc1`` as all gates then all ups; any other is replicated and must be equal on every rank."""
    if name.endswith(rows):
        return torch.cat(parts)
    if name.endswith(columns):
        return torch.cat(parts, dim=1)
    if name.endswith(("linear_fc1.weight", "linear_fc1.bias")):
        return torch.cat([p.chunk(2)[0] for p in parts] + [p.chunk(2)[1] for p in parts]) if gated else torch.cat(parts)
    if not all(torch.equal(p, parts[0]) for p in parts):
        raise AssertionError(f"{name}: a replicated tensor differs between tensor-parallel ranks")
    return parts[0]
