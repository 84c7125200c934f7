"""Our output loads into transformers with no missing or unexpected keys, and every tensor follows
the family's `_init_weights` rules — checked against the rules and against transformers' own init.

Tolerances come from the sample size: the sample std of n normal draws has a relative standard
error of 1/sqrt(2n); we allow 6 standard errors (two samples: 6/sqrt(n)).
"""
from __future__ import annotations

import json
import math

import pytest
import torch
import transformers

from tests.support import TINY

torch.set_num_threads(2)


def hf_rule_std(family: str, name: str, config: dict) -> float | None:
    """The std transformers' _init_weights gives a tensor; None for exact constants."""
    if name.endswith("bias") or "norm" in name.lower() or ".ln_" in name:
        return None
    std = config.get("initializer_range", 0.02)
    if family == "gpt2" and name.endswith("c_proj.weight"):
        return std / math.sqrt(2 * config["n_layer"])
    return std


def constant_value(name: str) -> float:
    return 0.0 if name.endswith("bias") else 1.0


@pytest.mark.parametrize("family", sorted(TINY))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tiny_model_loads_and_matches_hf_init(client, tmp_path, family, dtype):
    cfg = TINY[family]
    res = client.init_model(cfg, seed=0, out_dir=tmp_path, dtype=dtype)
    plan = client.plan(cfg, seed=0, dtype=dtype, tensors=True)
    arch = plan.architecture
    cls = getattr(transformers, arch)
    model, info = cls.from_pretrained(tmp_path, output_loading_info=True, dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    config = json.loads((tmp_path / "config.json").read_text())
    ours = {k: v.detach().float() for k, v in model.state_dict().items()}

    torch.manual_seed(0)
    reference = cls(model.config).float()  # transformers' own init for the same config
    theirs = {k: v.detach().float() for k, v in reference.state_dict().items()}

    for t in plan.tensors:
        w, ref = ours[t.name], theirs[t.name]
        assert tuple(w.shape) == tuple(t.shape) == tuple(ref.shape)
        expected = hf_rule_std(family, t.name, config)
        if expected is None:
            v = constant_value(t.name)
            assert torch.all(w == v), t.name
            assert torch.all(ref == v), f"transformers disagrees on {t.name}"
            continue
        x = w
        if t.HasField("padding_idx"):
            assert torch.all(w[t.padding_idx] == 0), t.name
            assert torch.all(ref[t.padding_idx] == 0), f"transformers does not zero row {t.padding_idx} of {t.name}"
            x = torch.cat([w[: t.padding_idx], w[t.padding_idx + 1 :]])
        n = x.numel()
        assert t.std == pytest.approx(expected, rel=1e-12), t.name
        assert abs(x.mean().item()) < 6 * expected / math.sqrt(n), t.name
        assert x.std().item() == pytest.approx(expected, rel=6 / math.sqrt(2 * n)), t.name
        # ...and the same distribution as transformers' own init gives that tensor.
        assert x.std().item() == pytest.approx(ref.std().item(), rel=6 / math.sqrt(n)), t.name
    assert res.total_params == sum(math.prod(t.shape) for t in plan.tensors)


def test_bert_tf_is_two_sigma_truncated(client, tmp_path):
    plan = client.plan(TINY["bert"], policy="bert-tf", dtype="float32", tensors=True)
    client.init_model(TINY["bert"], seed=0, policy="bert-tf", out_dir=tmp_path, dtype="float32")
    model = transformers.BertForMaskedLM.from_pretrained(tmp_path)
    sd = model.state_dict()
    for t in plan.tensors:
        if t.param == "weight" and t.kind in ("linear", "embedding"):
            w = sd[t.name].float()
            assert w.abs().max().item() <= 0.04 * (1 + 2**-23)
            assert t.effective_std == pytest.approx(0.02 * 0.87962566103423978, rel=1e-9)
            n = w.numel()
            assert w.std().item() == pytest.approx(t.effective_std, rel=6 / math.sqrt(2 * n))
