"""Computed tensors (SSM / hybrid / sinusoidal families) against transformers' own initialization.

For Mamba, Mamba-2, Qwen3-Next, Jamba, Nemotron-H and Pegasus (sinusoidal positions), every stored
tensor of modelinit's output is checked against the tensor transformers' own ``cls(config)`` makes:

* constants exactly (``D = 1``, ``±inf`` bounds);
* computed tensors that are a pure function of the config (``A_log = log(arange)``, a sinusoidal
  table) equal to transformers' float32 values within one float32 ulp (modelinit evaluates the
  formula in float64 and rounds once; transformers rounds each step in float32);
* computed tensors drawn then transformed (Mamba's ``dt_bias``, Qwen3-Next's ``A_log``) by the law
  of the draw: a two-sample Kolmogorov-Smirnov test against transformers' values, and for Mamba's
  ``dt_bias`` the exact law (softplus(dt_bias) log-uniform in [dt_min, dt_max]);
* every drawn tensor by its moments (tests/support/tensor_checks.py's tolerances from the sample size).

A tensor is "a pure function of the config" when two seeds give the same values.
"""
from __future__ import annotations

import math

import modelinit
import numpy as np
import pytest
import torch
import transformers
from modelinit.errors import ModelInitError
from modelinit_server.architectures import from_config
from modelinit_server.core import policies
from modelinit_server.core.planner import Request, build_plan

from tests.support.census import candidate
from tests.support.generic_configs import HANDMADE
from tests.support.tensor_checks import check_values, moments_of_rule, read_tensors

torch.set_num_threads(2)

SEED = 11
FAMILIES = ["mamba", "mamba2", "qwen3_next", "jamba", "nemotron_h", "pegasus"]


def document(model_type: str) -> tuple[str, dict]:
    if model_type in HANDMADE:
        doc = HANDMADE[model_type]
        return doc["architectures"][0], doc
    found = candidate(model_type)
    assert not isinstance(found, str), found
    return found


@pytest.fixture(scope="module")
def client():
    with modelinit.Client() as c:
        yield c


def ks_distance(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    return float(np.max(np.abs(np.searchsorted(a, grid, side="right") / a.size - np.searchsorted(b, grid, side="right") / b.size)))


def ks_critical(n: int, m: int, alpha: float = 1e-6) -> float:
    return math.sqrt(-math.log(alpha / 2) / 2) * math.sqrt((n + m) / (n * m))


def computed_values(spec, seed: int) -> dict[str, np.ndarray]:
    plan = build_plan(Request(spec, policies.Policy(), seed=seed, dtype="float32"))
    return {t.spec.name: t.sampler.array("float32") for t in plan.tensors if t.sampler.kind == "computed"}


@pytest.mark.parametrize("model_type", FAMILIES)
def test_every_tensor_follows_transformers_init(client, tmp_path, model_type):
    cls_name, doc = document(model_type)
    spec = from_config(doc, cls_name)
    computed = [t for t in spec.tensors if t.hf_init.kind == "computed"]
    assert computed, f"{model_type}: expected computed tensors"
    client.init_model(doc, seed=SEED, out_dir=tmp_path, dtype="float32", architecture=cls_name)
    ours = read_tensors(tmp_path)
    config = transformers.AutoConfig.from_pretrained(tmp_path)
    torch.manual_seed(0)
    theirs = getattr(transformers, cls_name)(config).state_dict()
    seed_a, seed_b = computed_values(spec, 1), computed_values(spec, 2)
    checked = {"pure": 0, "drawn": 0}
    for t in spec.tensors:
        h = t.hf_init
        x = ours[t.name]
        ref = theirs.get(h.origin if h.kind == "computed" else t.name)  # None: stored converted or renamed
        if h.kind == "computed":
            if np.array_equal(seed_a[t.name], seed_b[t.name], equal_nan=True):  # a function of the config alone
                checked["pure"] += 1
                assert torch.equal(torch.isinf(x), torch.isinf(ref)) and torch.equal(x[torch.isinf(x)], ref[torch.isinf(ref)])
                fin = torch.isfinite(ref)
                ulp = torch.finfo(torch.float32).eps * ref[fin].abs().clamp_min(torch.finfo(torch.float32).tiny)
                assert torch.all((x[fin] - ref[fin]).abs() <= ulp), f"{t.name}: not transformers' values within an ulp"
            else:
                checked["drawn"] += 1
                a, b = x.double().flatten().numpy(), ref.double().flatten().numpy()
                d = ks_distance(a, b)
                assert d <= ks_critical(a.size, b.size), f"{t.name}: KS distance {d:.3g} from transformers' own draw"
            continue
        mean, sigma, constant = moments_of_rule(h)
        zero_row = t.padding_idx if h.zero_row else None
        check_values(t.name, x, mean, sigma, constant, zero_row, model_type)
        if constant is not None and ref is not None:
            assert torch.equal(ref, torch.full_like(ref, constant)), f"{t.name}: transformers' own is not {constant}"
    assert checked["pure"] + checked["drawn"] == len(computed)


def test_mamba_dt_bias_is_inverse_softplus_of_a_log_uniform_draw(client, tmp_path):
    """dt = exp(u·(log dt_max − log dt_min) + log dt_min), clamped at dt_floor; dt_bias = dt + log(−expm1(−dt))."""
    cls_name, doc = document("mamba")
    client.init_model(doc, seed=SEED, out_dir=tmp_path, dtype="float32", architecture=cls_name)
    ours = read_tensors(tmp_path)
    config = transformers.AutoConfig.from_pretrained(tmp_path)
    lo, hi = math.log(config.time_step_min), math.log(config.time_step_max)
    biases = [v for k, v in ours.items() if k.endswith("dt_proj.bias")]
    assert len(biases) == config.num_hidden_layers
    for bias in biases:
        dt = torch.nn.functional.softplus(bias.double()).numpy()
        assert dt.min() >= config.time_step_min * (1 - 1e-5) and dt.max() <= config.time_step_max * (1 + 1e-5)
        u = (np.log(dt) - lo) / (hi - lo)  # uniform on (0, 1) if the law is right
        d = float(np.max(np.abs(np.sort(u) - (np.arange(1, u.size + 1) - 0.5) / u.size))) + 0.5 / u.size
        assert d <= math.sqrt(-math.log(1e-6 / 2) / 2) / math.sqrt(u.size), f"KS {d:.3g} against log-uniform"
    assert not torch.equal(biases[0], biases[1])  # each layer its own stream


def test_computed_values_are_a_function_of_the_seed(client, tmp_path):
    """Same seed, same bytes (twice, and through a fresh spec); another seed moves only drawn tensors."""
    cls_name, doc = document("mamba")
    spec = from_config(doc, cls_name)
    a, b, c = computed_values(spec, 5), computed_values(from_config(doc, cls_name), 5), computed_values(spec, 6)
    for name in a:
        assert a[name].tobytes() == b[name].tobytes()
    assert any(a[n].tobytes() != c[n].tobytes() for n in a if n.endswith("dt_proj.bias"))
    assert all(a[n].tobytes() == c[n].tobytes() for n in a if n.endswith("A_log"))


def test_plan_and_explain_say_computed(client):
    cls_name, doc = document("mamba")
    plan = client.plan(doc, seed=1, architecture=cls_name, tensors=True)
    rules = {t.name: t.rule for t in plan.tensors}
    a_log = next(n for n in rules if n.endswith("A_log"))
    assert "init.copy_" in rules[a_log] and "MambaMixer.init_mamba_weights" in rules[a_log], rules[a_log]


def test_a_global_generator_is_refused_by_name(client, monkeypatch):
    """Code that draws from numpy's global generator cannot be made a function of the seed."""
    from transformers.models.mamba import modeling_mamba

    original = modeling_mamba.MambaMixer.init_mamba_weights

    def drawn_by_numpy(self):
        original(self)
        from transformers import initialization as init

        init.copy_(self.D, torch.from_numpy(np.random.rand(*self.D.shape)).to(self.D.dtype))

    monkeypatch.setattr(modeling_mamba.MambaMixer, "init_mamba_weights", drawn_by_numpy)
    monkeypatch.setenv("MODELINIT_CACHE_DIR", "off")
    cls_name, doc = document("mamba")
    spec = from_config(doc, cls_name)
    with pytest.raises(ValueError, match=r"'backbone\.layers\.0\.mixer\.D'.*global random generator"):
        computed_values(spec, 1)


def test_weight_norm_magnitude_is_the_norm_of_the_stored_direction(client, tmp_path):
    cls_name, doc = document("wav2vec2")
    client.init_model(doc, seed=SEED, out_dir=tmp_path, dtype="float32", architecture=cls_name)
    ours = read_tensors(tmp_path)
    pairs = [k[: -len("original0")] for k in ours if k.endswith("parametrizations.weight.original0")]
    assert pairs
    for p in pairs:
        g, v = ours[p + "original0"], ours[p + "original1"]
        assert torch.allclose(g, torch.norm_except_dim(v, 2, 2), rtol=1e-6, atol=0)


def test_conv1d_and_constructor_values_follow_transformers(client, tmp_path):
    """GPT-1's Conv1D (normal 0.02 in its constructor), a learned activation parameter, latents."""
    for model_type, needle, law in (("openai-gpt", "h.0.attn.c_attn.weight", ("normal", 0.02)),
                                    ("apertus", "layers.0.mlp.act_fn.alpha_p", ("constant", None))):
        cls_name, doc = document(model_type)
        spec = from_config(doc, cls_name)
        t = next(t for t in spec.tensors if needle in t.name)
        assert t.hf_init.kind == law[0] and (law[1] is None or t.hf_init.std == law[1]), t.hf_init
        assert t.hf_init.source.startswith("constructor") or "normal_" in t.hf_init.source


def test_unsupported_random_pattern_is_refused_by_name(client):
    """sparse_ stays refused: a random sparsity pattern the engine cannot reproduce."""
    from modelinit_server.architectures.recorder import Record, _functions, _Recorder

    lin = torch.nn.Linear(4, 4, device="meta")
    rec = _Recorder(lin)
    _functions(rec)["sparse_"](lin.weight, 0.5)
    assert rec.records()["weight"] == Record(None, rec.records()["weight"].refusal)
    assert "sparsity pattern" in rec.records()["weight"].refusal


def test_unknown_model_type_is_still_invalid_argument(client):
    with pytest.raises(ModelInitError):
        client.plan({"model_type": "no_such_model_xyz"})


def test_config_with_infinity_is_decoded_and_written_back_as_transformers_writes_it(client, tmp_path):
    """transformers' to_json_file writes inf as {"__float__": "Infinity"} (Mamba-2's time_step_limit)."""
    import json

    config = transformers.Mamba2Config(**{k: v for k, v in HANDMADE["mamba2"].items() if k not in ("model_type", "architectures")})
    config.save_pretrained(tmp_path / "spec")
    assert '"__float__": "Infinity"' in (tmp_path / "spec" / "config.json").read_text()
    client.init_model(str(tmp_path / "spec"), seed=1, out_dir=tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["time_step_limit"] == [0.0, {"__float__": "Infinity"}]
    assert written["transformers_version"] == transformers.__version__  # as save_pretrained writes it
    model, info = transformers.Mamba2ForCausalLM.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert model.config.time_step_limit[1] == math.inf
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))


def test_empty_tensors_are_stored_empty(client, tmp_path):
    """DINOv3 with no register tokens holds a [1, 0, d] parameter: stored as an empty tensor, as
    save_pretrained stores it, and loaded back."""
    cls_name, doc = document("dinov3_vit")
    doc = dict(doc, num_register_tokens=0)
    spec = from_config(doc, cls_name)
    empty = [t for t in spec.tensors if t.numel == 0]
    assert [t.name for t in empty] == ["embeddings.register_tokens"] and empty[0].shape[1] == 0
    client.init_model(doc, seed=SEED, out_dir=tmp_path, dtype="bfloat16", architecture=cls_name)
    ours = read_tensors(tmp_path)
    assert tuple(ours["embeddings.register_tokens"].shape) == empty[0].shape
    _, info = getattr(transformers, cls_name).from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))


def test_a_zero_std_normal_is_its_mean(client):
    """init.normal_(t, std=0) (OneFormer's level_embed) fills the mean, as torch does."""
    from modelinit_server.architectures.recorder import _functions, _Recorder

    lin = torch.nn.Linear(4, 4, device="meta")
    rec = _Recorder(lin)
    _functions(rec)["normal_"](lin.weight, mean=0.5, std=0)
    init = rec.records()["weight"].init
    assert (init.kind, init.value) == ("constant", 0.5)


def test_served_files_and_slices_of_computed_tensors_equal_the_embedded_files(client, server_target, tmp_path):
    """Through a real server on port 0: the same files, and a slice of A_log / dt_bias cut exactly."""
    cls_name, doc = document("mamba")
    client.init_model(doc, seed=SEED, out_dir=tmp_path / "embedded", dtype="bfloat16", architecture=cls_name)
    with modelinit.Client(server_target) as remote:
        remote.init_model(doc, seed=SEED, out_dir=tmp_path / "served", dtype="bfloat16", architecture=cls_name)
        embedded, served = read_tensors(tmp_path / "embedded"), read_tensors(tmp_path / "served")
        assert all(torch.equal(embedded[k].view(torch.int16), served[k].view(torch.int16)) for k in embedded)
        a_log = "backbone.layers.1.mixer.A_log"
        got = remote.tensors(doc, seed=SEED, dtype="bfloat16", architecture=cls_name,
                             slices={a_log: ((3, 40), (2, 9))}, as_="torch")[a_log]
        assert torch.equal(got.view(torch.int16), embedded[a_log][3:40, 2:9].contiguous().view(torch.int16))


def test_rwkv_orthogonal_weights_are_orthogonal(client, tmp_path):
    """RWKV's orthogonal_(gain): torch's QR construction in float64 on the host."""
    cls_name, doc = document("rwkv")
    spec = from_config(doc, cls_name)
    ortho = [t for t in spec.tensors if "orthogonal_" in t.hf_init.source]
    assert ortho
    client.init_model(doc, seed=SEED, out_dir=tmp_path, dtype="float32", architecture=cls_name)
    ours = read_tensors(tmp_path)
    for t in ortho:
        w = ours[t.name].double().reshape(t.shape[0], -1)
        small = w if w.shape[0] <= w.shape[1] else w.T  # rows orthogonal when rows <= cols
        gram = small @ small.T
        gain2 = gram.diagonal().mean()
        assert gain2 > 0
        assert torch.allclose(gram / gain2, torch.eye(gram.shape[0], dtype=torch.float64), atol=1e-5), t.name
