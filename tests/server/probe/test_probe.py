"""`modelinit probe`: a real forward and backward pass of the filled model, per-layer measures, findings.

The seeds' case on a tiny Post-LN BERT (6 layers, width 64): std 1.0 and the torch.rand
re-initialization (uniform(0, 1) weights) are flagged, hf-default and bert-tf are not; the numbers
are a function of the request; JSON round-trips; the plot is a PNG; bad input is one line.
"""
from __future__ import annotations

import json
import sys
import math

import modelinit
import pytest
from modelinit.errors import ModelInitError
from modelinit_server.probe import from_json, to_json

from modelinit.cli import main

BERT = {"model_type": "bert", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4,
        "intermediate_size": 128, "max_position_embeddings": 128, "architectures": ["BertForMaskedLM"]}
LLAMA = {"model_type": "llama", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 128,
         "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": False}
WEIGHTS = {"kinds": ["linear", "embedding"], "params": ["weight"]}
STD_1 = {"preset": "hf-default", "rules": [{"name": "std 1.0", "match": WEIGHTS, "init": {"normal": {"std": 1.0}}}]}
TORCH_RAND = {"preset": "hf-default", "rules": [{"name": "torch.rand", "match": WEIGHTS,
                                                  "init": {"uniform": {"low": 0.0, "high": 1.0}}}]}
SEQ = 48


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """The command line in this process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def bert_results():
    return modelinit.probe(BERT, policies=["hf-default", "bert-tf", STD_1, TORCH_RAND], seed=3, seq=SEQ)


def test_sound_inits_have_no_findings(bert_results):
    for r in bert_results[:2]:
        assert r.findings == (), (r.policy, r.findings)
        m = r.measures
        assert abs(m.loss - math.log(1000)) < 0.05 * math.log(1000)  # near uniform predictions
        assert len(m.layers) == 6 and all(x.attn_entropy > 0.9 for x in m.layers)
        assert all(x.grad_norm > 0 and math.isfinite(x.grad_norm) for x in m.layers)


def test_std_one_is_flagged_naming_the_layer(bert_results):
    r = bert_results[2]
    assert r.policy == "policy[2]"
    text = " ".join(r.findings)
    assert "attention is saturated" in text and "at layer" in text
    assert "gradients explode toward the input" in text or "gradients vanish" in text
    assert "initial loss" in text


def test_torch_rand_reinit_is_flagged(bert_results):
    r = bert_results[3]
    assert r.findings, r.measures
    assert any("initial loss" in f or "non-finite" in f for f in r.findings)


def test_the_same_request_gives_the_same_numbers(bert_results):
    again = modelinit.probe(BERT, policies=["hf-default"], seed=3, seq=SEQ)[0]
    first = bert_results[0]
    assert again.measures == first.measures and again.findings == first.findings


def test_another_seed_gives_other_weights_and_batch_but_the_same_verdict(bert_results):
    """Another seed draws other weights and another batch: every layer's measures move (not only
    the loss), while what the policy is (its findings, the loss near ln(vocab)) stays."""
    first = bert_results[0]
    other = modelinit.probe(BERT, policies=["hf-default"], seed=4, seq=SEQ)[0]
    a, b = first.measures, other.measures
    assert a.loss != b.loss and a.embedding_std != b.embedding_std
    assert len(a.layers) == len(b.layers) == BERT["num_hidden_layers"]
    assert all(x.residual_std != y.residual_std and x.grad_norm != y.grad_norm for x, y in zip(a.layers, b.layers))
    assert other.findings == first.findings
    assert a.reference_loss == b.reference_loss == pytest.approx(math.log(BERT["vocab_size"]))
    assert abs(b.loss - a.loss) < 0.1 * a.reference_loss  # the same regime: both near uniform predictions


def test_json_round_trips(bert_results):
    text = to_json(bert_results)
    assert from_json(text) == bert_results
    doc = json.loads(text)
    assert [r["policy"] for r in doc["probe"]] == ["hf-default", "bert-tf", "policy[2]", "policy[3]"]


def test_pre_ln_llama_is_measured_without_findings():
    r = modelinit.probe(LLAMA, seed=1, seq=SEQ)[0]
    assert r.findings == ()
    assert [x.index for x in r.measures.layers] == [0, 1, 2, 3]
    assert all(x.attn_logit_std is not None for x in r.measures.layers)


def test_cli_compare_json_and_plot(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(BERT))
    policy = tmp_path / "std1.json"
    policy.write_text(json.dumps(STD_1))
    png = tmp_path / "probe.png"
    code, out, err = run_cli(["probe", str(config), "--compare", f"bert-tf,{policy}", "--seed", "3", "--seq", str(SEQ),
                              "--json", "--plot", str(png)], capsys)
    assert code == 0, err
    results = from_json(out)
    assert [r.policy for r in results] == ["hf-default", "bert-tf", str(policy)]
    assert results[2].findings and not results[0].findings
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    assert matplotlib.image.imread(str(png)).shape[2] in (3, 4)
    code, out, err = run_cli(["probe", str(config), "--seq", str(SEQ)], capsys)
    assert code == 0 and "no findings" in out and "residual std" in out



def test_without_matplotlib_the_probe_runs_and_only_plot_asks_for_it(tmp_path, capsys, monkeypatch):
    """The pass needs the server extra only: without matplotlib the table is printed, --plot says
    it needs matplotlib and which extra brings it (not 'the server extra', which is there);
    without rich, --json - still works."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(BERT))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    code, out, err = run_cli(["probe", str(config), "--seq", str(SEQ)], capsys)
    assert code == 0 and "residual std" in out, err
    code, out, err = run_cli(["probe", str(config), "--seq", str(SEQ), "--plot", str(tmp_path / "p.png")], capsys)
    assert code == 1 and err.count("\n") == 1, err
    assert "--plot needs matplotlib" in err and "'probe' extra" in err and "leave --plot out" in err
    assert "server extra" not in err
    monkeypatch.setitem(sys.modules, "rich", None)
    code, out, err = run_cli(["probe", str(config), "--seq", str(SEQ), "--json", "-"], capsys)
    assert code == 0 and [r.policy for r in from_json(out)] == ["hf-default"], err
    code, out, err = run_cli(["probe", str(config), "--seq", str(SEQ)], capsys)
    assert code == 1 and "the probe's table needs rich" in err and "--json -" in err

def test_a_model_without_an_input_the_probe_makes_is_one_line(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "wav2vec2", "hidden_size": 32, "num_hidden_layers": 2,
                                  "num_attention_heads": 2, "intermediate_size": 64, "conv_dim": [16, 16],
                                  "conv_stride": [5, 2], "conv_kernel": [10, 3], "num_conv_pos_embeddings": 16,
                                  "num_conv_pos_embedding_groups": 2, "architectures": ["Wav2Vec2Model"]}))
    code, out, err = run_cli(["probe", str(config)], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "input_values" in err and "token ids" in err


def test_a_model_beyond_the_memory_budget_is_one_line(capsys):
    code, out, err = run_cli(["probe", "llama-3-8b", "--memory-budget", "1GB", "--no-proxy"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "needs about" in err and "budget of 0.9 GiB" in err


def test_bad_batch_and_no_policy_are_refused():
    with pytest.raises(ModelInitError, match="batch and seq"):
        modelinit.probe(BERT, batch=0)
    with pytest.raises(ModelInitError, match="at least one policy"):
        modelinit.probe(BERT, policies=[])


# --- the proxy: depth kept, widths / F, fixed stds gain-matched ---------------------------------------

WIDE = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 256, "num_hidden_layers": 8, "num_attention_heads": 8,
        "num_key_value_heads": 4, "intermediate_size": 688, "max_position_embeddings": 128,
        "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": False}
WIDE_BERT = {"model_type": "bert", "vocab_size": 1000, "hidden_size": 256, "num_hidden_layers": 12, "num_attention_heads": 8,
             "intermediate_size": 1024, "max_position_embeddings": 128, "architectures": ["BertForMaskedLM"]}
#: What the proxy keeps (docs/probe.md): per-layer stds within these factors of the whole model's,
#: attention entropy within 0.05, the loss within 3%; output logits only for an untied head.
STD_FACTOR, GRAD_FACTOR, ENTROPY_DIFF, LOSS_REL = 1.35, 2.0, 0.05, 0.03


@pytest.mark.parametrize("config", [WIDE, WIDE_BERT], ids=["llama", "bert"])
@pytest.mark.parametrize("policy", ["hf-default", "xavier"])
def test_proxy_measures_agree_with_the_whole_model(config, policy):
    whole = modelinit.probe(config, policies=[policy], seed=2, seq=64, proxy=1)[0]
    proxy = modelinit.probe(config, policies=[policy], seed=2, seq=64, proxy=4)[0]
    assert whole.proxy == "" and "every width / 4" in proxy.proxy and proxy.params < whole.params / 8
    w, p = whole.measures, proxy.measures
    assert len(w.layers) == len(p.layers)

    def within(a: float, b: float, factor: float) -> bool:
        return a > 0 and b > 0 and max(a / b, b / a) <= factor

    last_w, last_p = w.layers[-1].grad_norm, p.layers[-1].grad_norm
    for a, b in zip(w.layers, p.layers):
        assert within(a.residual_std, b.residual_std, STD_FACTOR), (a, b)
        assert within(a.update_ratio, b.update_ratio, STD_FACTOR), (a, b)
        assert within(a.attn_logit_std, b.attn_logit_std, STD_FACTOR * 1.2), (a, b)
        assert abs(a.attn_entropy - b.attn_entropy) <= ENTROPY_DIFF
        assert within(a.grad_norm / last_w, b.grad_norm / last_p, GRAD_FACTOR), (a, b)
    assert abs(p.loss - w.loss) <= LOSS_REL * w.loss
    if config is WIDE and policy == "hf-default":  # an untied head under a fixed std: the logits keep their std too
        assert within(w.logit_std, p.logit_std, STD_FACTOR)


def test_fixed_stds_are_gain_matched_and_fan_based_rules_are_not():
    from modelinit_server.architectures import from_config
    from modelinit_server.core.policies import Policy, rules_for
    from modelinit_server.probe.proxy import fixed_std, gain_factors, proxy_config

    small, changes = proxy_config(WIDE, 4)
    assert small["hidden_size"] == 64 and small["num_attention_heads"] == 2 and small["num_key_value_heads"] == 1
    assert "hidden_size 256 -> 64" in changes
    full, proxy = from_config(WIDE), from_config(small)
    for preset, expected in (("hf-default", 2.0), ("xavier", None)):
        rules = rules_for(Policy(preset=preset), proxy)
        gains = gain_factors(full, proxy, lambda t: fixed_std(next(r for r in rules if r.match.selects(t)), t))
        if expected is None:
            assert gains == {}
        else:
            assert gains["model.layers.0.self_attn.q_proj.weight"] == expected  # sqrt(256 / 64)
            assert "model.embed_tokens.weight" not in gains  # an embedding's output std does not follow the width


@pytest.mark.slow
def test_every_output_of_a_proxy_says_proxy(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(WIDE))
    png = tmp_path / "p.png"
    code, out, err = run_cli(["probe", str(config), "--proxy", "4", "--seq", "32", "--plot", str(png)], capsys)
    assert code == 0, err
    assert "PROXY" in out
    code, out, err = run_cli(["probe", str(config), "--proxy", "4", "--seq", "32", "--json"], capsys)
    assert "every width / 4" in from_json(out)[0].proxy
    code, out, err = run_cli(["probe", str(config), "--proxy", "3", "--seq", "32"], capsys)
    assert code == 2 and "not divisible by the proxy factor 3" in err and err.count("\n") == 1


@pytest.mark.slow
def test_a_70b_spec_probes_as_a_proxy_within_the_budget(capsys):
    """llama-3-70b (70.6B parameters) within a 2 GiB budget: the proxy that fits is chosen and named."""
    r = modelinit.probe("llama-3-70b", seed=0, batch=1, seq=16, memory_budget=2 << 30)[0]
    assert "depth-preserving proxy" in r.proxy and r.params < 300_000_000
    assert len(r.measures.layers) == 80


def test_attention_measures_of_known_patterns():
    import torch
    from modelinit_server.probe.measures import attention_stats

    k = 8
    uniform = torch.full((1, 2, k, k), 1.0 / k)
    logit_std, entropy, max_p = attention_stats(uniform)
    assert logit_std == pytest.approx(0.0, abs=1e-12) and entropy == pytest.approx(1.0) and max_p == pytest.approx(1 / k)
    causal = torch.tril(torch.ones(k, k))
    causal = (causal / causal.sum(-1, keepdim=True)).expand(1, 2, k, k)
    assert attention_stats(causal)[1] == pytest.approx(1.0)  # uniform over the keys a causal row attends
    one_hot = torch.zeros(1, 1, k, k)
    one_hot[..., 0] = 1.0  # every query on key 0; the other probabilities underflowed
    logit_std, entropy, max_p = attention_stats(one_hot)
    assert entropy == pytest.approx(0.0, abs=1e-12) and max_p == 1.0 and logit_std > 30  # a lower bound, never 0


def test_growth_beyond_a_random_walk_is_flagged():
    """A residual stream that each layer amplifies (std doubling per layer) is flagged; one that adds
    unit updates (std ~ sqrt(layer + 1), what a pre-LN model under xavier or hf-default does) is not."""
    from modelinit_server.probe.findings import findings
    from modelinit_server.probe.measures import LayerMeasures, ModelMeasures

    def measures(stds):
        layers = tuple(LayerMeasures("", i, s, 1.0, 1.0, 1.0) for i, s in enumerate(stds))
        return ModelMeasures(loss=1.0, reference_loss=None, logit_std=None, embedding_std=1.0, layers=layers)

    doubling = findings(measures([2.0 ** i for i in range(8)]))
    assert any("activations grow with depth" in f and "128x" in f and "sqrt(8)" in f for f in doubling), doubling
    assert findings(measures([math.sqrt(i + 1) for i in range(8)])) == []


def test_each_branch_is_measured_against_the_residual(bert_results):
    """The attention and MLP branches (their output projections, before the residual addition)."""
    sound, std1 = bert_results[0].measures.layers, bert_results[2].measures.layers
    assert all(x.attn_branch and x.mlp_branch for x in sound + std1)
    # std 1.0 instead of 0.02: each projection's gain is 50x, the branch is larger by orders of magnitude
    assert min(x.mlp_branch for x in std1) > 100 * max(x.mlp_branch for x in sound)


def test_non_finite_values_are_a_finding():
    huge = {"preset": "hf-default", "rules": [{"match": WEIGHTS, "init": {"normal": {"std": 1e30}}}]}
    r = modelinit.probe(BERT, policies=[huge], seed=3, seq=16)[0]
    assert any(f.startswith("non-finite values") for f in r.findings), r.findings


def test_a_batch_too_large_even_for_a_proxy_is_one_line(capsys):
    code, out, err = run_cli(["probe", "bert-base-uncased", "--batch", "4096", "--seq", "512", "--memory-budget", "1GB"],
                             capsys)
    assert code == 2 and err.count("\n") == 1 and "even as a proxy" in err


def test_without_the_probe_extra_the_cli_says_what_to_install(capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "rich", None)  # as if it were not installed
    code, out, err = run_cli(["probe", "bert-base-uncased"], capsys)
    assert code == 1 and err.count("\n") == 1 and "install modelinit with the 'probe' extra" in err
    assert "pip install -e '.[probe]'" in err


def test_a_flat_series_gets_an_axis_whose_ticks_say_something():
    """A Post-LN model's residual std is ~1 at every layer: its log panel is widened so the tick
    labels differ (they were eight times '1.00002'), and a spread series keeps its own range."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    from modelinit_server.probe import ProbeResult
    from modelinit_server.probe.measures import LayerMeasures, ModelMeasures
    from modelinit_server.probe.report import MIN_LOG_SPAN, figure

    layers = tuple(LayerMeasures("", i, residual_std=1.00001 + 1e-5 * (i % 3), update_ratio=10.0 ** -i, grad_norm=1.0,
                                 hidden_grad_std=1.0) for i in range(8))
    result = ProbeResult("BertModel (bert)", "hf-default", 0, "4 x 16 tokens", 1000,
                         ModelMeasures(loss=6.9, reference_loss=6.9, logit_std=1.0, embedding_std=1.0, layers=layers), ())
    fig = figure([result])
    try:
        fig.canvas.draw()
        residual, update = fig.axes[0], fig.axes[1]
        low, high = residual.get_ylim()
        assert high / low == pytest.approx(MIN_LOG_SPAN)
        shown = [t.get_text() for t in residual.get_yticklabels(minor=False) + residual.get_yticklabels(minor=True)
                 if low <= t.get_position()[1] <= high and t.get_text()]
        assert shown and len(shown) == len(set(shown)), shown
        low, high = update.get_ylim()
        assert low <= 1e-7 and high >= 1.0  # eight decades: left as they are
    finally:
        plt.close(fig)
