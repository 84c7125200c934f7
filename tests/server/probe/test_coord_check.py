"""The coordinate check (issue 45, docs/probe.md): `modelinit probe SPEC --widths ... --steps K`.

On a tiny GPT-2 and a tiny Llama (widths 32, 64, 128; 3 Adam steps): hf-default (standard
parametrization) grows with width after one step in the output logits, the attention logits and
the hidden activations; mup with µP's learning rates stays stable; the scales are a function of
the request; bad requests are one line naming the flag.
"""
from __future__ import annotations

import dataclasses
import json

import modelinit
import pytest
from modelinit.cli import main
from modelinit_server.probe import coord_from_json, coord_to_json
from modelinit_server.probe.coord import lr_groups, threshold, widened_config

from tests.support.stacks import install_mup

GPT2 = {"model_type": "gpt2", "vocab_size": 256, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64,
        "architectures": ["GPT2LMHeadModel"], "tie_word_embeddings": False}
LLAMA = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 64,
         "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": False}
WIDTHS = [32, 64, 128]
STEPS = 3
SMALL = dict(batch=2, seq=32)
#: A block's output (the residual stream) and the layer's attention logits, per model.
HIDDEN = {"gpt2": ("transformer.h.1", "transformer.h.0.attn_logits"),
          "llama": ("model.layers.1", "model.layers.0.attn_logits")}


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module", params=[GPT2, LLAMA], ids=["gpt2", "llama"])
def checked(request):
    config = request.param
    return config, modelinit.coord_check(config, policies=["hf-default", "mup"], widths=WIDTHS, steps=STEPS, seed=0, **SMALL)


def test_standard_parametrization_grows_after_one_adam_step(checked):
    config, (sp, _) = checked
    by = {s.module: s for s in sp.series}
    hidden, attn = HIDDEN[config["model_type"]]
    bar = threshold(len(WIDTHS))
    for name in ("logits", attn, hidden):
        assert by[name].verdicts[1] == "growing", (name, by[name].slopes)  # t = 2: after one step
        assert by[name].slopes[1] > bar
    assert by["logits"].slopes[0] == pytest.approx(0.5, abs=0.1)  # at init already: std 0.02 · sqrt(width)
    assert sp.first_problem and "growing" in sp.first_problem and "step 1" in sp.first_problem
    assert "one LR 0.001" in sp.lr_rule


def test_mup_with_its_learning_rates_is_stable(checked):
    _, (_, mup) = checked
    assert mup.first_problem == "", mup.first_problem
    assert all(s.verdict == "stable" for s in mup.series), [(s.module, s.slopes) for s in mup.series if s.verdict != "stable"]
    assert "MuAdam" in mup.lr_rule and "256/width" in mup.lr_rule
    assert all(v == 0 for v in next(s for s in mup.series if s.module == "logits").values[0])  # zero readout at init
    assert all(a > b for a, b in zip(mup.losses[0], mup.losses[-1]))  # it trains


def test_the_same_request_gives_the_same_scales(checked):
    config, (sp, _) = checked
    again = modelinit.coord_check(config, policies=["hf-default"], widths=WIDTHS, steps=STEPS, seed=0, **SMALL)[0]
    assert again.series == sp.series and again.losses == sp.losses


def test_json_round_trips(checked):
    _, results = checked
    text = coord_to_json(results)
    assert coord_from_json(text) == results
    doc = json.loads(text)["coord_check"]
    assert doc[0]["series"][-1]["module"] == "logits" and doc[0]["series"][-1]["verdict"] == "growing"


def test_widening_keeps_the_head_size_and_the_gqa_ratio():
    wide = widened_config(LLAMA, 256)
    assert (wide["hidden_size"], wide["num_attention_heads"], wide["num_key_value_heads"], wide["intermediate_size"]) == (256, 16, 8, 512)
    assert widened_config(GPT2, 32)["n_head"] == 2
    with pytest.raises(ValueError, match=r"^--widths: 40 is not a multiple of the head size 16"):
        widened_config(LLAMA, 40)
    with pytest.raises(ValueError, match=r"^--widths: 16 gives 1 heads.*num_key_value_heads.*multiples of 32"):
        widened_config(LLAMA, 16)
    with pytest.raises(ValueError, match=r"^--widths: the config's num_local_experts"):
        widened_config(dict(LLAMA, num_local_experts=4), 128)
    assert threshold(2) == 0.5 and threshold(5) == 0.25


def test_mup_learning_rates_by_shape():
    import torch

    from modelinit_server.architectures import meta_models

    model = meta_models.meta_model(widened_config(LLAMA, 128), "LlamaForCausalLM")
    wide = meta_models.meta_model(widened_config(LLAMA, 256), "LlamaForCausalLM")
    groups, _ = lr_groups(model, 128, 1e-3, "adam", True, wide)
    lr = {id(p): g["lr"] for g in groups for p in g["params"]}
    named = dict(model.named_parameters())
    assert lr[id(named["model.layers.0.self_attn.q_proj.weight"])] == pytest.approx(2e-3)  # 1e-3 · 256 / 128
    assert lr[id(named["model.layers.0.mlp.down_proj.weight"])] == pytest.approx(2e-3)
    assert lr[id(named["lm_head.weight"])] == lr[id(named["model.embed_tokens.weight"])] == 1e-3
    assert lr[id(named["model.norm.weight"])] == 1e-3
    groups, _ = lr_groups(model, 128, 0.1, "sgd", True, wide)
    lr = {id(p): g["lr"] for g in groups for p in g["params"]}
    assert lr[id(named["model.embed_tokens.weight"])] == pytest.approx(0.05) and lr[id(named["model.layers.0.mlp.up_proj.weight"])] == 0.1
    assert isinstance(named["lm_head.weight"], torch.nn.Parameter)


def test_mup_learning_rates_match_mu_adam():
    """µP's Adam rates against microsoft/mup's MuAdam after set_base_shapes (base width 256):
    ``pip install --no-deps mup`` (its declared torchvision would replace the CPU torch)."""
    mup = install_mup()
    from modelinit_server.architectures import meta_models

    def model_at(width: int):  # mup wants its own MuReadout for a head (the same shape: ours reads only shapes)
        m = meta_models.meta_model(widened_config(LLAMA, width), "LlamaForCausalLM")
        m.lm_head = mup.MuReadout(width, LLAMA["vocab_size"], bias=False, device="meta")
        return m

    model, wide, base, delta = model_at(128), model_at(256), model_at(256), model_at(512)
    ours = {id(p): g["lr"] for g in lr_groups(model, 128, 1e-3, "adam", True, wide)[0] for p in g["params"]}
    mup.set_base_shapes(model, base, delta=delta)
    theirs = {id(p): g["lr"] for g in mup.MuAdam(model.parameters(), lr=1e-3).param_groups for p in g["params"]}
    assert ours.keys() == theirs.keys()
    assert all(ours[k] == pytest.approx(theirs[k]) for k in ours)


def test_sgd_runs_with_mu_sgd_rates():
    sp, mup = modelinit.coord_check(LLAMA, policies=["hf-default", "mup"], widths=[32, 64], steps=2, optimizer="sgd", **SMALL)
    assert sp.lr == mup.lr == 0.1 and "sgd, one LR 0.1" in sp.lr_rule and "MuSGD" in mup.lr_rule
    assert all(x == x for step in sp.losses + mup.losses for x in step)
    assert "growing" in sp.first_problem  # what µP under SGD gives at tiny widths: left (docs/probe.md, "Not yet")


@pytest.mark.parametrize("argv, start", [
    (["--widths", "64"], "--widths: a coordinate check needs at least two different widths"),
    (["--widths", "64,72"], "--widths: 72 is not a multiple of the head size 16"),
    (["--widths", "64,a"], "--widths: give hidden sizes separated by commas"),
    (["--widths", "32,64", "--steps", "0"], "--steps: must be at least 1"),
    (["--widths", "32,64", "--lr", "-1"], "--lr: must be a positive number"),
    (["--widths", "32,64", "--memory-budget", "1MB"], "--widths: width 64"),
    (["--widths", "32,64", "--proxy", "2"], "--proxy: the coordinate check sets the widths itself"),
    (["--steps", "2"], "--steps: only with --widths"),
])
def test_bad_requests_are_one_line_naming_the_flag(tmp_path, capsys, argv, start):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA))
    code, out, err = run_cli(["probe", str(config), *argv], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"modelinit: error: {start}"), err
    if "memory" in " ".join(argv):
        assert "larger --memory-budget" in err


def test_cli_table_json_and_plot(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA))
    png = tmp_path / "coord.png"
    code, out, err = run_cli(["probe", str(config), "--compare", "mup", "--widths", "32,64", "--steps", "2", "--batch", "2",
                              "--seq", "16", "--json", "--plot", str(png)], capsys)
    assert code == 0, err
    results = coord_from_json(out)
    assert [r.policy for r in results] == ["hf-default", "mup"] and results[0].widths == (32, 64)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, out, err = run_cli(["probe", str(config), "--widths", "32,64", "--steps", "2", "--batch", "2", "--seq", "16"], capsys)
    assert code == 0 and "coordinate check" in out and "growing" in out and "first:" in out, err


@pytest.mark.parametrize("policy", ["hf-default", "mup"])
def test_scales_match_mup_get_coord_data(policy):
    """The same Llama, filled with the same bytes, the same batch, widths and Adam steps through
    microsoft/mup's own ``get_coord_data`` (``MuReadout`` and ``MuAdam`` after ``set_base_shapes``
    at base width 256 for µP; plain Adam otherwise): every module's mean |output| agrees. Needs
    mup and pandas, which tests/support/stacks.py installs into tests/.stacks."""
    mup = install_mup()  # and pandas, which its coord_check imports (tests/support/stacks.py)
    import torch
    from modelinit.request import RequestOptions
    from mup.coord_check import get_coord_data
    from modelinit_server.architectures import meta_models
    from modelinit_server.messages import request_from_pb
    from modelinit_server.probe.coord import _spec, coord_check
    from modelinit_server.probe.run import build, make_batch

    widths, steps, lr = [32, 64], 3, 1e-3  # 3: the zero-initialized query's first update shows at t = 3
    request = request_from_pb(RequestOptions(seed=0, policy=policy, dtype="float32").request(LLAMA))
    ours = coord_check(request, policy, widths, steps, "adam", lr, batch=2, seq=16)

    def with_readout(m, width):
        head = mup.MuReadout(width, LLAMA["vocab_size"], bias=False, readout_zero_init=policy == "mup",
                             device=m.lm_head.weight.device)
        if m.lm_head.weight.device.type != "meta":
            with torch.no_grad():
                head.weight.copy_(m.lm_head.weight)
        m.lm_head = head
        return m

    def lazy(width):
        def make():
            with torch.no_grad():
                model = build(dataclasses.replace(request, model=_spec(request, width)))
            if policy == "mup":
                base = with_readout(meta_models.meta_model(widened_config(LLAMA, 256), "LlamaForCausalLM"), 256)
                delta = with_readout(meta_models.meta_model(widened_config(LLAMA, 512), "LlamaForCausalLM"), 512)
                mup.set_base_shapes(with_readout(model, width), base, delta=delta)
            return model
        return make

    with torch.no_grad():
        probe_model = build(dataclasses.replace(request, model=_spec(request, 32)))
    data = make_batch(probe_model, 0, 2, 16)
    batch = dict(data.inputs, labels=data.labels)
    names = [s.module for s in ours.series if s.module not in ("logits",) and not s.module.endswith(("attn_logits", "self_attn"))]
    df = get_coord_data({w: lazy(w) for w in widths}, [batch], optimizer="adam", lr=lr, mup=policy == "mup", dict_in_out=True,
                        nsteps=steps, cuda=False, show_progress=False, filter_module_by_name=lambda n: n in names)
    theirs = {(row.module.split(":")[0], int(row.t), int(row.width)): row.l1 for row in df.itertuples()
              if ":" not in row.module or row.module.endswith(":out[0]")}
    by = {s.module: s for s in ours.series}
    compared = 0
    for name in names:
        for t in range(steps):
            for i, w in enumerate(widths):
                assert by[name].values[t][i] == pytest.approx(theirs[(name, t + 1, w)], rel=1e-4, abs=1e-7), (name, t, w)
                compared += 1
    assert compared > 20 * steps * len(widths)
