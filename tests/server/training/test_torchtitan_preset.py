"""The ``torchtitan-llama3`` preset against torchtitan's own init, on torchtitan's own Llama 3
(issue 33): the same model initialized by its ``init_states`` (torch's RNG) and filled by
``init_module_(policy="torchtitan-llama3")`` draws, per parameter, from the same law.

torchtitan 0.3.0's Llama 3 (``models/llama3/__init__.py``): ``wqkv`` and ``w1`` trunc_normal(std 0.02)
with torch's absolute bounds ±2; ``wo``, ``w2``, ``w3`` the same with std 0.02/sqrt(2(layer+1));
norms 1; the output trunc_normal(std dim**-0.5, ±3σ); the token embedding N(0, 1), or, in the tied
flavors (1B, 3B: ``enable_weight_tying``, the embedding's init skipped), the output's law, since the
two are one tensor and ``Decoder.init_states`` ties them before the output's init runs.
"""
from __future__ import annotations

import dataclasses
import math

import pytest

torch = pytest.importorskip("torch")
stats = pytest.importorskip("scipy.stats")

import modelinit  # noqa: E402

from tests.support.stacks import TORCHTITAN_HF as HF  # noqa: E402
from tests.support.stacks import install_torchtitan  # noqa: E402

#: torchtitan's own debugmodel flavor (dim 256, 16 heads and KV heads, FFN 768, vocabulary 2048), cut to 2 layers.
LLAMA = {**HF, "num_key_value_heads": 16}
P_MIN = 1e-6
"""Each statistical check fails a correct law with probability below this."""


@pytest.fixture(scope="module", autouse=True)
def torchtitan():
    return install_torchtitan()


def _config(tied: bool):
    """torchtitan's debugmodel flavor cut to 2 layers; ``tied``: as its 1B and 3B flavors build theirs
    (``enable_weight_tying``, the embedding's own init skipped)."""
    from torchtitan.models.common.param_init import skip_param_init
    from torchtitan.models.llama3 import model_registry

    config = model_registry("debugmodel", attn_backend="flex").model
    config = dataclasses.replace(config, layers=config.layers[:2])
    if tied:
        embeddings = dataclasses.replace(config.tok_embeddings, param_init={"weight": skip_param_init})
        config = dataclasses.replace(config, enable_weight_tying=True, tok_embeddings=embeddings)
    return config


def _materialized(config):
    with torch.device("meta"):
        model = config.build()
    return model.to_empty(device="cpu")


def _exceedances_allowed(n: int, m: int) -> int:
    """How many of m draws may lie beyond the largest of n draws of the same law with probability at
    least P_MIN: P(k or more) = prod_{i<k} (m-i)/(n+m-i) <= (m/(n+m))**k."""
    return math.ceil(math.log(P_MIN) / math.log(m / (n + m)))


def _same_law(name: str, a, b) -> None:
    """``a`` (torchtitan's draws) and ``b`` (ours) come from one law: constants equal element for
    element; else a two-sample KS test, the stds within 6 standard errors of their ratio (the
    sample std's relative error is about 1/sqrt(2n) each), and the same support: no more of either
    beyond the other's largest magnitude than chance allows (a ±3σ truncation on one side only puts
    0.27% of the other's draws beyond it)."""
    a, b = a.detach().reshape(-1).double(), b.detach().reshape(-1).double()
    if torch.all(a == a[0]):
        assert torch.equal(a, b), name
        return
    n, m = a.numel(), b.numel()
    assert stats.ks_2samp(a.numpy(), b.numpy()).pvalue > P_MIN, name
    assert abs(float(a.std() / b.std()) - 1) < 6 * math.sqrt(1 / (2 * n) + 1 / (2 * m)), (name, float(a.std()), float(b.std()))
    assert int((b.abs() > a.abs().max()).sum()) < _exceedances_allowed(n, m), (name, float(a.abs().max()), float(b.abs().max()))
    assert int((a.abs() > b.abs().max()).sum()) < _exceedances_allowed(m, n), (name, float(a.abs().max()), float(b.abs().max()))


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_the_torchtitan_preset_draws_what_torchtitans_own_init_draws(tied):
    config = _config(tied)
    own = _materialized(config)
    torch.manual_seed(0)
    own.init_states()  # torchtitan's own init, as its trainer runs it after to_empty
    ours = _materialized(config)
    modelinit.init_module_(ours, seed=7, spec={**LLAMA, "tie_word_embeddings": tied}, policy="torchtitan-llama3")
    mine = dict(ours.named_parameters(remove_duplicate=False))
    checked = []
    for name, p in own.named_parameters(remove_duplicate=False):
        _same_law(name, p, mine[name])
        checked.append(name)
    assert len(checked) == 2 + 2 * 7 + 1 and ("lm_head.weight" in checked) and ("tok_embeddings.weight" in checked)
    assert (ours.tok_embeddings.weight is ours.lm_head.weight) == tied  # tied again, as init_states ties them
