"""Architectures vs. the real transformers models: names, order, shapes, ties, metadata, configs.

Big presets are built on the meta device; tiny models are built for real to check what
``save_pretrained`` writes and that ``from_pretrained`` loads our config + those tensors cleanly.
"""
from __future__ import annotations

import copy

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip("the architectures mirror transformers 5.x (tie/save rules, rope_parameters)", allow_module_level=True)
from modelinit_server import architectures  # noqa: E402
from modelinit_server.architectures import (  # noqa: E402
    FAMILIES,
    from_config,
    from_preset,
    preset_names,
)
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers.pytorch_utils import Conv1D  # noqa: E402

transformers.logging.set_verbosity_error()

# ---------------------------------------------------------------- helpers


def hf_config(spec):
    """The transformers config object for our config dict."""
    return transformers.CONFIG_MAPPING[spec.family].from_dict(dict(spec.config))


def hf_model(spec, device="cpu"):
    """The HF model class named by ``spec.architecture``, built from our config."""
    with torch.device(device):
        return getattr(transformers, spec.architecture)(hf_config(spec))


def saved_names(model) -> list[str]:
    """``state_dict()`` minus what ``save_pretrained`` drops: tied targets and ignore-on-save keys.

    (Non-persistent buffers are never in ``state_dict()``.) ``test_tiny_models_save`` checks this
    rule against real ``save_pretrained`` output.
    """
    drop = set(model.all_tied_weights_keys) | set(model._keys_to_ignore_on_save or ())
    return [k for k in model.state_dict() if k not in drop]


def ours(spec) -> list[tuple[str, tuple[int, ...]]]:
    return [(t.name, t.shape) for t in spec.tensors]


def theirs(model) -> list[tuple[str, tuple[int, ...]]]:
    sd = model.state_dict()
    return [(k, tuple(sd[k].shape)) for k in saved_names(model)]


def module_of(model, name: str):
    return model.get_submodule(name.rsplit(".", 1)[0])


def check_metadata(model, spec) -> None:
    """Kind, fans, param, layer and padding_idx agree with the HF module that owns each tensor."""
    for t in spec.tensors:
        module = module_of(model, t.name)
        if isinstance(module, torch.nn.Linear):
            assert (t.kind, t.fan_in, t.fan_out) == ("linear", module.in_features, module.out_features), t.name
        elif isinstance(module, Conv1D):
            assert (t.kind, t.fan_in, t.fan_out) == ("linear", module.weight.shape[0], module.nf), t.name
        elif isinstance(module, torch.nn.Embedding):
            assert (t.kind, t.fan_in, t.fan_out) == ("embedding", module.embedding_dim, module.num_embeddings), t.name
            assert t.padding_idx == module.padding_idx, t.name
        elif "Norm" in type(module).__name__:
            assert (t.kind, t.fan_in, t.fan_out) == ("norm", module.weight.shape[0], module.weight.shape[0]), t.name
        else:  # the bare MLM output bias: the decoder's bias, owned by the head module
            assert (t.kind, t.role, t.param) == ("linear", "lm_head", "bias"), t.name
            assert (t.fan_in, t.fan_out) == (spec.hidden_size, spec.config["vocab_size"]), t.name
        assert t.param == t.name.rsplit(".", 1)[1], t.name
        block = re.search(r"(?:^|\.)(?:layer|layers|h)\.(\d+)\.", t.name)
        assert t.layer == (int(block.group(1)) if block else None), t.name
        if t.kind != "embedding":
            assert t.padding_idx is None, t.name


# ---------------------------------------------------------------- presets (meta device)


#: Presets on the built-in fast path (the others go through transformers: tests/server/architectures/test_generic.py).
FAST_PRESETS = [n for n in preset_names() if architectures.PRESETS[n]["model_type"] in FAMILIES]


@pytest.mark.parametrize("name", FAST_PRESETS)
def test_preset_matches_hf(name):
    spec = from_preset(name, architectures.PRESETS[name]["architectures"][0])  # the class alone, no hub extras
    model = hf_model(spec, "meta")
    assert ours(spec) == theirs(model)
    assert spec.tied == model.all_tied_weights_keys
    check_metadata(model, spec)
    assert spec.architecture == spec.config["architectures"][0] == type(model).__name__


def _meaning(model_type: str, document) -> dict:
    """What transformers 5 makes of a config document (its own full serialization). On a deep copy:
    transformers 5 writes ``rope_theta`` into the ``rope_scaling`` dict it is given, which would
    change the shared preset for every later test."""
    written = transformers.CONFIG_MAPPING[model_type].from_dict(copy.deepcopy(dict(document))).to_diff_dict()
    for key in ("transformers_version", "dtype", "architectures"):
        written.pop(key, None)
    return written


@pytest.mark.parametrize("name", FAST_PRESETS)
def test_preset_config_means_the_hub_config(name):
    """Our config.json loads as the hub config does; RoPE keys keep the hub's names (transformers
    4.57 reads only rope_scaling / rope_theta)."""
    spec = from_preset(name)
    hub = architectures.PRESETS[name]
    assert _meaning(spec.family, spec.config) == _meaning(spec.family, hub)
    for key in ("rope_scaling", "rope_theta"):
        if key in hub:
            assert spec.config[key] == hub[key]
    assert "dtype" not in spec.config and "torch_dtype" not in spec.config


def test_preset_headline_sizes():
    """Spot-check the public configs' sizes (and parameter counts) the presets encode."""
    tiny = from_preset("tinyllama-1.1b")
    cfg = tiny.config
    assert (tiny.hidden_size, tiny.n_layers, cfg["intermediate_size"]) == (2048, 22, 5632)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]) == (32, 4, 32000)
    assert from_preset("llama-3-8b").config["rope_theta"] == 500000.0
    assert "rope_parameters" not in from_preset("llama-3-8b").config
    expected_billions = {
        "gpt2": 0.124, "llama-2-7b": 6.738, "llama-3-8b": 8.030, "mistral-7b": 7.242, "qwen2.5-7b": 7.616,
    }
    for name, billions in expected_billions.items():
        assert from_preset(name).numel / 1e9 == pytest.approx(billions, abs=1e-3), name


def test_unknown_preset_lists_choices():
    with pytest.raises(ValueError, match=r"^spec\.preset: unknown preset 'foo'; use one of: bert-base-uncased, "):
        from_preset("foo")


def test_a_long_unknown_preset_is_quoted_as_an_excerpt():
    with pytest.raises(ValueError) as e:
        from_preset("x" * 100_000)
    assert "xxx..." in str(e.value) and len(str(e.value)) < 1000

def test_presets_are_not_mutated():
    spec = from_preset("gpt2")
    spec.config["n_embd"] = 1
    assert from_preset("gpt2").config["n_embd"] == 768
    assert architectures.PRESETS["llama-3-8b"]["rope_theta"] == 500000.0


# ---------------------------------------------------------------- tiny real models

_BERT = dict(
    vocab_size=97, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=24,
    max_position_embeddings=20,
)
_GPT2 = dict(vocab_size=97, n_embd=16, n_layer=2, n_head=4, n_positions=20, bos_token_id=0, eos_token_id=0)
_DECODER = dict(
    vocab_size=97, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
)

TINY = {
    "bert-mlm": dict(model_type="bert", **_BERT),
    "bert-mlm-untied": dict(model_type="bert", tie_word_embeddings=False, **_BERT),
    "bert-base-no-pad": dict(
        model_type="bert", architectures=["BertModel"], pad_token_id=None, type_vocab_size=3, **_BERT
    ),
    "roberta-mlm": dict(model_type="roberta", **_BERT),
    "roberta-base": dict(model_type="roberta", architectures=["RobertaModel"], **_BERT),
    "gpt2-lm": dict(model_type="gpt2", **_GPT2),
    "gpt2-lm-untied-n_inner": dict(model_type="gpt2", tie_word_embeddings=False, n_inner=40, **_GPT2),
    "gpt2-base": dict(model_type="gpt2", architectures=["GPT2Model"], **_GPT2),
    "llama": dict(model_type="llama", **_DECODER),
    "llama-tied-pad": dict(model_type="llama", tie_word_embeddings=True, pad_token_id=0, **_DECODER),
    "llama-biases-head_dim": dict(model_type="llama", attention_bias=True, mlp_bias=True, head_dim=8, **_DECODER),
    "llama-base-negative-pad": dict(model_type="llama", architectures=["LlamaModel"], pad_token_id=-1, **_DECODER),
    "mistral": dict(model_type="mistral", **_DECODER),
    "mistral-base-head_dim": dict(model_type="mistral", architectures=["MistralModel"], head_dim=6, **_DECODER),
    "qwen2": dict(model_type="qwen2", **_DECODER),
    "qwen2-tied": dict(model_type="qwen2", tie_word_embeddings=True, **_DECODER),
    "qwen2-base-head_dim": dict(model_type="qwen2", architectures=["Qwen2Model"], head_dim=8, **_DECODER),
}


def read_safetensors(path: Path) -> dict[str, tuple[int, ...]]:
    with safe_open(str(path), "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


@pytest.mark.parametrize("case", list(TINY))
def test_tiny_models_save(case, tmp_path):
    """Our tensors == what save_pretrained writes; our order == state_dict order."""
    spec = from_config(TINY[case])
    model = hf_model(spec)
    model.save_pretrained(tmp_path / "hf")
    written = read_safetensors(tmp_path / "hf" / "model.safetensors")
    assert dict(ours(spec)) == written
    assert [t.name for t in spec.tensors] == saved_names(model)
    assert set(written) == set(saved_names(model)), "the saved-keys rule the preset tests rely on"
    check_metadata(model, spec)


@pytest.mark.parametrize("case", list(TINY))
def test_our_config_and_tensors_load_cleanly(case, tmp_path):
    """Our config.json + one tensor per spec entry load with no missing/unexpected/mismatched key."""
    spec = from_config(TINY[case])
    (tmp_path / "config.json").write_text(json.dumps(dict(spec.config)))
    tensors = {t.name: torch.zeros(t.shape) for t in spec.tensors}
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    cls = getattr(transformers, spec.architecture)
    model, info = cls.from_pretrained(tmp_path, output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}
    for tied, stored in spec.tied.items():  # the loader re-tied what we left out
        assert model.get_parameter(tied) is model.get_parameter(stored)


def test_padding_rows_match_hf_modules():
    assert from_config(TINY["llama-base-negative-pad"]).tensors[0].padding_idx == 96
    roberta = {t.name: t.padding_idx for t in from_config(TINY["roberta-mlm"]).tensors}
    assert roberta["roberta.embeddings.word_embeddings.weight"] == 1
    assert roberta["roberta.embeddings.position_embeddings.weight"] == 1
    bert = {t.name: t.padding_idx for t in from_config(TINY["bert-mlm"]).tensors}
    assert bert["bert.embeddings.word_embeddings.weight"] == 0
    assert bert["bert.embeddings.position_embeddings.weight"] is None
    assert from_config(TINY["llama"]).tensors[0].padding_idx is None


def test_roles_and_layers():
    spec = from_config(TINY["gpt2-lm"])
    roles = {t.name: (t.role, t.layer) for t in spec.tensors}
    assert roles["transformer.h.1.attn.c_attn.weight"] == ("qkv", 1)
    assert roles["transformer.h.0.attn.c_proj.weight"] == ("attn_out", 0)
    assert roles["transformer.h.1.mlp.c_fc.bias"] == ("mlp_in", 1)
    assert roles["transformer.h.1.mlp.c_proj.weight"] == ("mlp_out", 1)
    assert roles["transformer.ln_f.weight"] == ("final_norm", None)
    assert roles["transformer.wpe.weight"] == ("position_embedding", None)
    bert = {t.name: t.role for t in from_config(TINY["bert-mlm"]).tensors}
    assert bert["cls.predictions.bias"] == "lm_head"
    assert bert["cls.predictions.transform.dense.weight"] == "head_transform"
    assert bert["cls.predictions.transform.LayerNorm.weight"] == "head_norm"
    assert bert["bert.embeddings.token_type_embeddings.weight"] == "token_type_embedding"
    assert bert["bert.embeddings.LayerNorm.bias"] == "embedding_norm"
    assert bert["bert.encoder.layer.1.attention.output.LayerNorm.weight"] == "attn_norm"
    assert bert["bert.encoder.layer.1.output.LayerNorm.weight"] == "mlp_norm"
    assert {t.name: t.role for t in from_config(TINY["bert-base-no-pad"]).tensors}["pooler.dense.weight"] == "pooler"
    llama = {t.name: t.role for t in from_config(TINY["llama-tied-pad"]).tensors}
    assert llama["model.layers.0.mlp.gate_proj.weight"] == llama["model.layers.0.mlp.up_proj.weight"] == "mlp_in"
    assert llama["model.layers.0.post_attention_layernorm.weight"] == "mlp_norm"
    assert "lm_head.weight" not in llama


# ---------------------------------------------------------------- configs vs transformers


CONFIG_CASES = {
    **TINY,
    "bert-defaults": {"model_type": "bert"},
    "roberta-defaults": {"model_type": "roberta"},
    "gpt2-defaults": {"model_type": "gpt2"},
    "gpt2-aliases": {  # the generic names win over n_embd, as in GPT2Config
        "model_type": "gpt2", "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
        "max_position_embeddings": 8, "n_embd": 64,
    },
    "llama-defaults": {"model_type": "llama"},
    "llama3-legacy-rope": {
        "model_type": "llama", "rope_theta": 500000.0, "max_position_embeddings": 131072,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
    },
    "llama-rope-parameters": {"model_type": "llama", "rope_parameters": {"rope_type": "linear", "factor": 2.0}},
    "mistral-defaults": {"model_type": "mistral"},
    "qwen2-defaults": {"model_type": "qwen2"},
    "qwen2-sliding": {
        "model_type": "qwen2", "use_sliding_window": True, "num_hidden_layers": 4, "max_window_layers": 2,
    },
    "extra-keys-kept": {
        "model_type": "llama", "torch_dtype": "bfloat16", "transformers_version": "4.40.0", "use_mrope": False,
    },
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_config_matches_transformers(case):
    document = CONFIG_CASES[case]
    spec = from_config(document)
    assert _meaning(spec.family, spec.config) == _meaning(spec.family, document)
    assert spec.config["architectures"] == [spec.architecture]
    for key in ("rope_scaling", "rope_theta"):
        if key in document:
            assert spec.config[key] == document[key]
    assert spec.config["model_type"] == spec.family
    assert spec.initializer_range == spec.config["initializer_range"]


def test_defaults_per_family():
    defaults = {"bert": "BertForMaskedLM", "roberta": "RobertaForMaskedLM", "gpt2": "GPT2LMHeadModel",
                "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
    assert {m: f.architectures[0] for m, f in FAMILIES.items()} == defaults
    gpt2 = from_config({"model_type": "gpt2"})
    shapes = {t.name: t.shape for t in gpt2.tensors}
    assert gpt2.config["n_inner"] is None and shapes["transformer.h.0.mlp.c_fc.weight"] == (768, 3072)  # 4 * n_embd
    llama = from_config({"model_type": "llama", "num_attention_heads": 8, "hidden_size": 512, "num_hidden_layers": 1})
    assert llama.config["num_key_value_heads"] == 8 and llama.config["head_dim"] == 64
    qwen = {t.name for t in from_config({"model_type": "qwen2", "num_hidden_layers": 1}).tensors}
    assert {"model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.v_proj.bias"} <= qwen
    assert "model.layers.0.self_attn.o_proj.bias" not in qwen


def test_cross_attention_goes_through_transformers():
    """The built-in families do not write cross-attention layers out; transformers does."""
    spec = from_config({"model_type": "gpt2", "n_layer": 1, "add_cross_attention": True})
    assert spec.transformers_version
    assert "transformer.h.0.crossattention.c_attn.weight" in {t.name for t in spec.tensors}


def test_accepts_json_text():
    text = json.dumps({"model_type": "gpt2", "n_layer": 1, "torch_dtype": "float32"})
    spec = from_config(text)
    assert spec.n_layers == 1 and spec.hidden_size == 768
    assert "torch_dtype" not in spec.config and "dtype" not in spec.config


def test_module_does_not_import_torch():
    """The built-in presets plan without torch (the generic ones need transformers, hence torch)."""
    code = (
        "import sys, modelinit_server; had = 'torch' in sys.modules\n"
        "from modelinit_server import architectures as a\n"
        f"[a.from_preset(n) for n in {FAST_PRESETS!r}]\n"
        "assert had or 'torch' not in sys.modules, 'architectures imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": ":".join(sys.path)})


# ---------------------------------------------------------------- validation

def bad(field: str, detail: str = "") -> str:
    """The expected message: ``spec.config.<field>: <detail>...`` (``spec.config: ...`` for the document)."""
    where = r"spec\.config" + (r"\." + re.escape(field) if field else "")
    return f"^{where}: {detail}"


BAD = [
    ("{not json", "", "not valid JSON"),
    ("[1, 2]", "", "must be a JSON object"),
    (42, "", "must be a JSON object"),
    ({"hidden_size": 8}, "model_type", "missing or not a string"),
    ({"model_type": "not-a-model"}, "model_type", "unsupported model type 'not-a-model': transformers"),
    ({"model_type": ["llama"]}, "model_type", "missing or not a string"),
    ({"model_type": "bert", "architectures": ["BertForNothing"]},
     "architectures", "'BertForNothing' is not a transformers class of model_type 'bert'; use one of: .*BertForMaskedLM"),
    ({"model_type": "llama", "architectures": ["GPT2LMHeadModel"]},
     "architectures", ".*LlamaForCausalLM, .*LlamaModel"),
    ({"model_type": "llama", "architectures": []}, "architectures", "must be a non-empty list"),
    ({"model_type": "llama", "architectures": "LlamaForCausalLM"}, "architectures", ""),
    ({"model_type": "bert", "hidden_size": 100, "num_attention_heads": 12},
     "num_attention_heads", "hidden_size 100 is not divisible"),
    ({"model_type": "gpt2", "n_embd": 100, "n_head": 12}, "n_head", "n_embd 100 is not divisible"),
    ({"model_type": "llama", "hidden_size": 100, "num_attention_heads": 3, "head_dim": 32},
     "num_attention_heads", ""),
    ({"model_type": "llama", "num_key_value_heads": 3}, "num_key_value_heads", "3 does not divide"),
    ({"model_type": "llama", "num_key_value_heads": 64}, "num_key_value_heads", ""),
    ({"model_type": "mistral", "num_key_value_heads": None},
     "num_key_value_heads", "must be a positive integer"),
    ({"model_type": "llama", "vocab_size": 0}, "vocab_size", "must be a positive integer"),
    ({"model_type": "llama", "vocab_size": -5}, "vocab_size", ""),
    ({"model_type": "llama", "vocab_size": 2**31 + 1}, "vocab_size", ".* larger than"),
    ({"model_type": "llama", "hidden_size": 4096.0}, "hidden_size", "must be a positive integer"),
    ({"model_type": "llama", "hidden_size": "4096"}, "hidden_size", ""),
    ({"model_type": "llama", "hidden_size": True}, "hidden_size", ""),
    ({"model_type": "llama", "num_hidden_layers": 10001},
     "num_hidden_layers", "10001 layers is more than 10000"),
    ({"model_type": "gpt2", "n_layer": 0}, "n_layer", ""),
    ({"model_type": "gpt2", "num_hidden_layers": 0}, "n_layer", ""),
    ({"model_type": "gpt2", "n_inner": 0}, "n_inner", ""),
    ({"model_type": "bert", "type_vocab_size": 0}, "type_vocab_size", ""),
    ({"model_type": "bert", "pad_token_id": 30522}, "pad_token_id", "30522 is outside the 30522 rows"),
    ({"model_type": "roberta", "pad_token_id": 600},
     "pad_token_id", "600 is outside the 512 rows of position_embeddings"),
    ({"model_type": "llama", "pad_token_id": 1.5}, "pad_token_id", ""),
    ({"model_type": "llama", "eos_token_id": [1, "x"]}, "eos_token_id", ""),
    ({"model_type": "llama", "initializer_range": 0}, "initializer_range", r"must be in \(0, 1\]"),
    ({"model_type": "llama", "initializer_range": 5.0}, "initializer_range", ""),
    ({"model_type": "llama", "rms_norm_eps": -1e-6}, "rms_norm_eps", "must be > 0"),
    ({"model_type": "bert", "layer_norm_eps": float("nan")}, "layer_norm_eps", ""),
    ({"model_type": "llama", "tie_word_embeddings": "yes"}, "tie_word_embeddings", "must be true or false"),
    ({"model_type": "llama", "attention_bias": 1}, "attention_bias", ""),
    ({"model_type": "llama", "rope_theta": -1.0}, "rope_theta", "must be > 0"),
    ({"model_type": "llama", "rope_parameters": {"rope_theta": "big"}}, "rope_parameters.rope_theta", ""),
    ({"model_type": "llama", "rope_scaling": "linear"}, "rope_scaling", "must be a JSON object"),
    ({"model_type": "qwen2", "num_hidden_layers": 2, "layer_types": ["full_attention"]}, "layer_types", ""),
    ({"model_type": "qwen2", "head_dim": 0}, "head_dim", ""),
    ({"model_type": "bert", "hidden_dropout_prob": 2}, "hidden_dropout_prob", ""),
    ({"model_type": "bert", "hidden_act": None}, "hidden_act", "must be a string"),
]


@pytest.mark.parametrize(
    "config, field, detail", BAD, ids=[f"{i}-{field or 'document'}" for i, (_, field, _) in enumerate(BAD)]
)
def test_bad_configs(config, field, detail):
    with pytest.raises(ValueError, match=bad(field, detail)):
        from_config(config)


def test_presets_are_read_only_and_their_copies_are_not():
    """A preset's config cannot be changed for the next caller (transformers 5 once wrote ``rope_theta``
    into llama-3.1-8b's ``rope_scaling`` through a shallow copy): every change raises where it is made;
    a deep copy, from_preset and from_config give plain documents to change."""
    import pickle

    presets = architectures.PRESETS
    hub = presets["llama-3.1-8b"]
    for change in (lambda: hub["rope_scaling"].__setitem__("rope_theta", 1.0), lambda: hub.update(vocab_size=1),
                   lambda: hub.pop("vocab_size"), lambda: hub["architectures"].append("X"),
                   lambda: hub["architectures"].__setitem__(0, "X"), lambda: hub["architectures"].sort()):
        with pytest.raises(TypeError, match="read-only"):
            change()
    for table in (presets, architectures.PRESET_EXTRAS):
        with pytest.raises(TypeError, match="does not support item assignment"):
            table["mine"] = {}
    assert "rope_theta" not in hub["rope_scaling"] and hub["architectures"] == ["LlamaForCausalLM"]
    for mine in (copy.deepcopy(hub), pickle.loads(pickle.dumps(hub)), from_preset("llama-3.1-8b").config):
        assert type(mine) is dict and type(mine["rope_scaling"]) is dict and type(mine["architectures"]) is list
        mine["rope_scaling"]["rope_theta"] = 1.0
        mine["architectures"].append("X")
    assert "rope_theta" not in hub["rope_scaling"] and hub["architectures"] == ["LlamaForCausalLM"]
    assert json.loads(json.dumps(hub)) == copy.deepcopy(hub) == hub
