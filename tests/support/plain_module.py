"""A small plain ``torch.nn.Module`` (no transformers class behind it) and a policy that matches every
one of its parameters: what ``init_module_`` fills from a policy alone (tests/server/training/test_init_module.py,
and a fresh interpreter there that must not import transformers)."""
from __future__ import annotations

import torch


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm = torch.nn.LayerNorm(8)
        self.proj = torch.nn.Linear(8, 8)


class Plain(torch.nn.Module):
    def __init__(self, extra: bool = False, vocab: int = 11):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, 8, padding_idx=0)
        self.layers = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(8, vocab, bias=False)
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
        if extra:
            self.scale = torch.nn.Parameter(torch.ones(3))


POLICY = {"rules": [
    {"match": {"kinds": ["embedding"]}, "init": {"normal": {"std": 1.0}}, "zero_padding_row": True},
    {"match": {"kinds": ["norm"], "params": ["weight"]}, "init": "ones"},
    {"match": {"params": ["bias"]}, "init": "zeros"},
    {"match": {"kinds": ["linear"], "params": ["weight"], "min_layer": 0}, "init": {"trunc_normal": {"std": 0.02}},
     "depth_scaling": "layer"},
    {"match": {"names": ["head.weight"]}, "init": {"trunc_normal": {"std": 0.02}}},
]}
