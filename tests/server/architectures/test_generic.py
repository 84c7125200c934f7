"""Any transformers family: the generic path (architectures/hf.py) against transformers itself.

1. tiny configs of 20 families (and task heads of the built-in ones) load with nothing missing,
   unexpected or mismatched, are laid out exactly as ``save_pretrained`` lays them out, and every
   tensor follows transformers' own initialization statistically (constants and zero rows exactly);
2. the hand-written fast path of the built-in families equals the generic path tensor for tensor;
3. the on-disk spec cache gives back exactly what it stored, survives corruption, can be turned off;
4. the hub presets load into every class of their family and plan with the hub's parameter counts;
5. one seed gives one backbone, whatever head class is asked for;
6. every policy applies to any family (experts, vision, encoder-decoder);
7. unsupported input is INVALID_ARGUMENT from a real server, naming the field and the fix.

Statistical tolerances come from the sample size n: the sample mean is within K standard errors
(K * sigma / sqrt(n)) of the expected mean, and the sample std within a relative
K * sqrt(1 / (2 (n - 1))) of the expected sigma (normal theory; uniform and truncated normals have
lighter tails, so it is conservative for them too).
"""
from __future__ import annotations

import copy
import json
import math
import pathlib
import re
import struct

import grpc
import modelinit
import pytest
import torch
import transformers
from modelinit.errors import ModelInitError
from modelinit_server.architectures import FAMILIES, _fields, from_config, from_preset, hf, spec_cache
from modelinit_server.core import policies

from tests.support.generic_configs import BUILT_IN, CASES, HEADS, TINY
from tests.support.tensor_checks import check_values, moments_of_rule, moments_of_sampler, read_tensors

torch.set_num_threads(2)

SEED = 7
CASE_IDS = [c[0] for c in CASES]
CASE = {c[0]: c for c in CASES}
#: Cases also written (and compared) in bfloat16: a built-in family, an MoE, an encoder-decoder.
BF16_CASES = ["llama", "mixtral", "t5"]


@pytest.fixture(scope="module", autouse=True)
def spec_cache_dir(tmp_path_factory):
    """Generic specs are cached in a folder of this module's, never in ~/.cache."""
    folder = tmp_path_factory.mktemp("spec-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MODELINIT_CACHE_DIR", str(folder))
        yield folder


@pytest.fixture(scope="module")
def local():
    with modelinit.Client() as c:
        yield c


# --- helpers ---------------------------------------------------------------------------------


def raw_tensors(folder: pathlib.Path) -> dict[str, tuple[str, list[int], bytes]]:
    """Each tensor's (dtype, shape, bytes) exactly as the safetensors files hold them."""
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        data = f.read_bytes()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        body = data[8 + n:]
        for name, info in header.items():
            if name == "__metadata__":
                continue
            lo, hi = info["data_offsets"]
            out[name] = (info["dtype"], info["shape"], body[lo:hi])
    return out


def layout(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    return {k: (tuple(v.shape), v.dtype) for k, v in tensors.items()}


def case_spec(case_id: str):
    _, model_type, cls = CASE[case_id]
    return from_config(TINY[model_type], cls)


# --- generated models and their transformers references, each built once ---------------------


class Generated:
    """Our output folder for one case, and transformers' own model of the same config."""

    def __init__(self, client, root: pathlib.Path, case_id: str) -> None:
        _, model_type, cls_name = CASE[case_id]
        self.case_id = case_id
        self.out = root / case_id / "float32"
        res = client.init_model(TINY[model_type], seed=SEED, out_dir=self.out, dtype="float32", architecture=cls_name or None)
        self.plan = client.plan(TINY[model_type], seed=SEED, dtype="float32", architecture=cls_name or None, tensors=True)
        self.result = res
        self.config = transformers.AutoConfig.from_pretrained(self.out)
        self.cls = getattr(transformers, self.config.architectures[0])
        self.spec = case_spec(case_id)
        self.resolved = policies.resolve(policies.Policy(), self.spec)
        self.ours = read_tensors(self.out)
        torch.manual_seed(0)
        self.reference = self.cls(self.config)  # transformers' own initialization
        self.reference.eval()
        ref_dir = root / case_id / "reference-float32"
        self.reference.save_pretrained(ref_dir)
        self.theirs = read_tensors(ref_dir)
        self._root = root
        self._client = client

    def bfloat16(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(our bfloat16 output, transformers' bfloat16 model as save_pretrained writes it)."""
        _, model_type, cls_name = CASE[self.case_id]
        out = self._root / self.case_id / "bfloat16"
        self._client.init_model(TINY[model_type], seed=SEED, out_dir=out, dtype="bfloat16", architecture=cls_name or None)
        ref_dir = self._root / self.case_id / "reference-bfloat16"
        copy.deepcopy(self.reference).to(torch.bfloat16).save_pretrained(ref_dir)
        return read_tensors(out), read_tensors(ref_dir)


@pytest.fixture(scope="module")
def generated(local, tmp_path_factory):
    root = tmp_path_factory.mktemp("generic")
    built: dict[str, Generated] = {}

    def get(case_id: str) -> Generated:
        if case_id not in built:
            built[case_id] = Generated(local, root, case_id)
        return built[case_id]

    return get


# --- 1. any family loads, is laid out as save_pretrained does, and follows transformers' init -----


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_loads_with_nothing_missing(generated, case_id):
    g = generated(case_id)
    _, _, cls_name = CASE[case_id]
    if cls_name:
        assert g.config.architectures == [cls_name]
    _, info = g.cls.from_pretrained(g.out, output_loading_info=True)
    assert not info["missing_keys"], info
    assert not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_layout_is_save_pretrained(generated, case_id):
    g = generated(case_id)
    assert layout(g.ours) == layout(g.theirs)
    assert [t.name for t in g.plan.tensors] == [t.name for t in g.spec.tensors]
    assert set(g.ours) == {t.name for t in g.spec.tensors}
    assert g.result.total_params == sum(v.numel() for v in g.theirs.values())


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_statistics_match_transformers_init(generated, case_id):
    g = generated(case_id)
    plans = {t.name: t for t in g.plan.tensors}
    for t, r in zip(g.spec.tensors, g.resolved):
        mean, sigma, constant = moments_of_sampler(r)
        if t.hf_init is not None:
            # the planner's distribution is the recorded rule, and the rule's own numbers say the same
            rule_mean, rule_sigma, rule_constant = moments_of_rule(t.hf_init)
            assert rule_constant == constant, t.name
            assert math.isclose(rule_mean, mean, rel_tol=1e-9, abs_tol=1e-12), t.name
            assert math.isclose(rule_sigma, sigma, rel_tol=1e-9, abs_tol=1e-12), t.name
            assert (r.sampler.zero_row is not None) == t.hf_init.zero_row, t.name
        p = plans[t.name]
        assert math.isclose(p.effective_std, sigma, rel_tol=1e-12, abs_tol=1e-15), t.name
        zero_row = r.sampler.zero_row
        check_values(t.name, g.ours[t.name], mean, sigma, constant, zero_row, "ours")
        # ...and transformers' own init of the same config follows the same rule
        check_values(t.name, g.theirs[t.name], mean, sigma, constant, zero_row, "transformers")
        # a row transformers zeroes (a padding row) is zero in ours too
        theirs = g.theirs[t.name]
        if constant is None and theirs.dim() == 2 and theirs.shape[0] > 1:
            zero_rows = (theirs == 0).all(dim=1).nonzero().flatten().tolist()
            assert zero_rows == ([] if zero_row is None else [zero_row]), (t.name, zero_rows)


@pytest.mark.parametrize("case_id", BF16_CASES)
def test_bfloat16_matches_a_bfloat16_model(generated, case_id):
    g = generated(case_id)
    ours, theirs = g.bfloat16()
    assert layout(ours) == layout(theirs)
    assert {v.dtype for v in ours.values()} == {torch.bfloat16}
    for t, r in zip(g.spec.tensors, g.resolved):
        mean, sigma, constant = moments_of_sampler(r)
        check_values(t.name, ours[t.name], mean, sigma, constant, r.sampler.zero_row, "ours (bf16)")
        check_values(t.name, theirs[t.name], mean, sigma, constant, r.sampler.zero_row, "transformers (bf16)")
        # rounding to bfloat16 is the only difference from the float32 output of the same seed
        assert torch.equal(ours[t.name], g.ours[t.name].to(torch.bfloat16)), t.name


# --- 2. the built-in fast path is the generic path ----------------------------------------------

FAST_CASES = [(mt, cls) for mt, classes in BUILT_IN.items() for cls in classes]


def _fields_of(t) -> tuple:
    return (t.name, t.shape, t.kind, t.role, t.param, t.layer, t.fan_in, t.fan_out, t.padding_idx)


@pytest.mark.parametrize(("model_type", "cls"), FAST_CASES, ids=[c for _, c in FAST_CASES])
def test_fast_path_equals_generic_path(model_type, cls):
    doc = TINY[model_type]
    assert cls in FAMILIES[model_type].architectures  # the fast path handles it
    fast = from_config(doc, cls)
    assert fast.transformers_version == ""  # built by hand, not through transformers
    generic = hf.build(_fields.load_document(doc), cls)
    assert generic.transformers_version == transformers.__version__
    assert [t.name for t in fast.tensors] == [t.name for t in generic.tensors]
    differ = [(f.name, f"fast kind={f.kind} role={f.role} fans={f.fan_in},{f.fan_out} pad={f.padding_idx} layer={f.layer}",
               f"generic kind={g.kind} role={g.role} fans={g.fan_in},{g.fan_out} pad={g.padding_idx} layer={g.layer}")
              for f, g in zip(fast.tensors, generic.tensors) if _fields_of(f) != _fields_of(g)]
    assert not differ, differ
    assert dict(fast.tied) == dict(generic.tied)
    assert fast.base_model_prefix == generic.base_model_prefix
    assert (fast.family, fast.architecture, fast.n_layers, fast.hidden_size, fast.initializer_range) == (
        generic.family, generic.architecture, generic.n_layers, generic.hidden_size, generic.initializer_range)
    # hf-default: the family's hand-written rules and the recorded ones give the same samplers
    samplers_fast = [r.sampler for r in policies.resolve(policies.Policy(), fast)]
    samplers_generic = [r.sampler for r in policies.resolve(policies.Policy(), generic)]
    differ = [(t.name, a, b) for t, a, b in zip(fast.tensors, samplers_fast, samplers_generic) if a != b]
    assert not differ, differ


# --- 3. the spec cache ----------------------------------------------------------------------------

CACHE_CASES = ["mixtral", "t5", "vit", "deepseek_v3", "BertForSequenceClassification"]


def _spec_files(folder: pathlib.Path) -> list[pathlib.Path]:
    return sorted((folder / "specs").glob("*.json")) if (folder / "specs").is_dir() else []


def _count_builds(monkeypatch) -> list[str]:
    calls: list[str] = []
    real = hf.build

    def counting(document, architecture=""):
        calls.append(architecture)
        return real(document, architecture)

    monkeypatch.setattr(hf, "build", counting)
    return calls


@pytest.mark.parametrize("case_id", CACHE_CASES)
def test_cached_spec_equals_fresh_one(case_id, tmp_path, monkeypatch):
    _, model_type, cls = CASE[case_id]
    monkeypatch.setenv("MODELINIT_CACHE_DIR", str(tmp_path))
    fresh = hf.build(_fields.load_document(TINY[model_type]), cls)
    calls = _count_builds(monkeypatch)
    first = from_config(TINY[model_type], cls)
    assert len(calls) == 1 and len(_spec_files(tmp_path)) == 1
    second = from_config(TINY[model_type], cls)
    assert len(calls) == 1, "the second resolution must come from the cache"
    assert first == fresh
    assert second == fresh  # dataclass equality: every tensor, rule, config key and the tied map
    assert [t.hf_init for t in second.tensors] == [t.hf_init for t in fresh.tensors]
    (path,) = _spec_files(tmp_path)
    assert spec_cache.from_json(json.loads(path.read_text())) == fresh


CORRUPTIONS = {
    "empty": lambda text: "",
    "not-json": lambda text: "{not json",
    "truncated": lambda text: text[: len(text) // 2],
    "wrong-type": lambda text: "[]",
    "missing-keys": lambda text: json.dumps({"format": 1}),
    "bad-kind": lambda text: text.replace('"linear"', '"no-such-kind"', 1),
    "binary": lambda text: "\udcff\x00\x01",
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_corrupted_cache_file_is_rebuilt(corruption, tmp_path, monkeypatch):
    monkeypatch.setenv("MODELINIT_CACHE_DIR", str(tmp_path))
    doc = TINY["mixtral"]
    fresh = from_config(doc)
    (path,) = _spec_files(tmp_path)
    good = path.read_text()
    path.write_bytes(CORRUPTIONS[corruption](good).encode("utf-8", "surrogateescape"))
    calls = _count_builds(monkeypatch)
    assert from_config(doc) == fresh
    assert len(calls) == 1, "a corrupted file is ignored and the spec built again"
    assert spec_cache.from_json(json.loads(path.read_text())) == fresh, "and stored again"
    assert from_config(doc) == fresh and len(calls) == 1


def test_cache_off_stores_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELINIT_CACHE_DIR", "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert spec_cache.cache_dir() is None
    calls = _count_builds(monkeypatch)
    a = from_config(TINY["vit"])
    b = from_config(TINY["vit"])
    assert a == b
    assert len(calls) == 2, "with the cache off every resolution builds"
    assert not list(tmp_path.rglob("*")), "nothing is written anywhere"


def test_cache_key_covers_class_and_document(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELINIT_CACHE_DIR", str(tmp_path))
    a = from_config(TINY["llama"], "LlamaForSequenceClassification")
    b = from_config(TINY["llama"], "LlamaForTokenClassification")
    c = from_config({**TINY["llama"], "num_hidden_layers": 3}, "LlamaForSequenceClassification")
    assert len(_spec_files(tmp_path)) == 3
    assert a.architecture != b.architecture and a.n_layers == 2 and c.n_layers == 3


# --- 4. presets ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def preset_folders(local, tmp_path_factory):
    """bert-base-uncased and roberta-base written once each, in bfloat16 to keep them small."""
    root = tmp_path_factory.mktemp("presets")
    made = {}

    def get(name: str) -> pathlib.Path:
        if name not in made:
            local.init_model(name, seed=SEED, out_dir=root / name, dtype="bfloat16")
            made[name] = root / name
        return made[name]

    return get


PRESET_LOADS = [
    ("bert-base-uncased", "BertModel", set()),
    ("bert-base-uncased", "BertForMaskedLM", set()),
    ("bert-base-uncased", "BertForPreTraining", set()),
    ("bert-base-uncased", "BertForSequenceClassification", {"classifier.weight", "classifier.bias"}),
    ("roberta-base", "RobertaModel", set()),
    ("roberta-base", "RobertaForMaskedLM", set()),
]


@pytest.mark.parametrize(("preset", "cls", "missing"), PRESET_LOADS, ids=[f"{p}-{c}" for p, c, _ in PRESET_LOADS])
def test_preset_loads_into_every_class(preset_folders, preset, cls, missing):
    folder = preset_folders(preset)
    model, info = getattr(transformers, cls).from_pretrained(folder, output_loading_info=True)
    assert set(info["missing_keys"]) == missing, info
    assert not info["mismatched_keys"], info
    if cls == "BertForPreTraining":  # the class the hub checkpoint was saved from: nothing left over
        assert not info["unexpected_keys"], info


#: deepseek-v3 last: the per-expert test after it pages through the plan the embedded client keeps.
PRESET_PARAMS = {
    "mixtral-8x7b": 46_702_792_704,
    "qwen3-8b": 8_190_735_360,
    "gemma-2-9b": 9_241_705_984,
    "phi-3-mini": 3_821_079_552,
    "llama-3.1-8b": 8_030_261_248,
    "deepseek-v3": 671_026_419_200,
}


@pytest.mark.parametrize("preset", list(PRESET_PARAMS))
def test_new_presets_plan_with_hub_parameter_counts(local, preset):
    plan = local.plan(preset)
    assert plan.total_params == PRESET_PARAMS[preset]
    itemsize = {"float32": 4, "bfloat16": 2, "float16": 2}[plan.request.dtype]
    assert plan.total_bytes == itemsize * PRESET_PARAMS[preset]
    assert plan.architecture == from_preset(preset).architecture


def test_deepseek_v3_is_stored_per_expert(local):
    plan = local.plan("deepseek-v3", tensors=True)  # paged: 45k tensors
    assert plan.tensor_count == len(plan.tensors)
    names = {t.name: t for t in plan.tensors}
    t = names["model.layers.3.mlp.experts.255.down_proj.weight"]
    assert (t.kind, t.role, list(t.shape)) == ("expert", "mlp_out", [7168, 2048])
    assert "model.layers.3.mlp.experts.0.gate_proj.weight" in names
    assert not any(n.endswith("experts.gate_up_proj") or n.endswith("experts.down_proj") for n in names), "no fused experts"
    assert "model.layers.2.mlp.experts.0.down_proj.weight" not in names  # the first 3 layers are dense


# --- 5. one seed, one backbone --------------------------------------------------------------------

BACKBONES = [
    ("BertForSequenceClassification", "BertModel", "bert", "bert"),
    ("BertForPreTraining", "BertModel", "bert", "bert"),
    ("BertForMaskedLM", "BertModel", "bert", "bert"),
    ("RobertaForTokenClassification", "RobertaModel", "roberta", "roberta"),
    ("LlamaForSequenceClassification", "LlamaModel", "llama", "model"),
    ("LlamaForCausalLM", "LlamaModel", "llama", "model"),
]


@pytest.fixture(scope="module")
def written(local, tmp_path_factory):
    root = tmp_path_factory.mktemp("backbones")
    made: dict[str, dict] = {}

    def get(model_type: str, cls: str) -> dict[str, tuple[str, list[int], bytes]]:
        if cls not in made:
            local.init_model(TINY[model_type], seed=SEED, out_dir=root / cls, dtype="float32", architecture=cls)
            made[cls] = raw_tensors(root / cls)
        return made[cls]

    return get


@pytest.mark.parametrize(("head", "base", "model_type", "prefix"), BACKBONES, ids=[b[0] for b in BACKBONES])
def test_one_seed_one_backbone(written, head, base, model_type, prefix):
    heads = written(model_type, head)
    bases = written(model_type, base)
    backbone = {n[len(prefix) + 1:]: v for n, v in heads.items() if n.startswith(prefix + ".")}
    assert backbone, f"{head} has no tensors under {prefix}."
    assert len(backbone) < len(heads), f"{head} has no head tensors"
    missing = sorted(set(backbone) - set(bases))
    assert not missing, f"{head} backbone tensors absent from {base}: {missing}"
    differ = sorted(n for n, v in backbone.items() if v != bases[n])
    assert not differ, f"{head} and {base} differ on {differ}"
    # what the base has and the head lacks is only the pooler the head does not build
    assert all(n.startswith("pooler.") for n in set(bases) - set(backbone)), sorted(set(bases) - set(backbone))


# --- 6. policies apply to any family --------------------------------------------------------------


def test_gpt2_policy_scales_mixtral_experts(local, tmp_path):
    cfg = TINY["mixtral"]
    plan = local.plan(cfg, policy="gpt2", tensors=True)
    n_layers, n_experts = cfg["num_hidden_layers"], cfg["num_local_experts"]
    w2 = [t for t in plan.tensors if t.kind == "expert" and t.role == "mlp_out"]
    assert len(w2) == n_layers * n_experts
    assert all(t.name.endswith(".w2.weight") for t in w2)
    scaled = 0.02 / math.sqrt(2 * n_layers)
    for t in w2:
        assert t.std == pytest.approx(scaled, rel=1e-12), t.name
        assert t.rule == "residual out scaled"
    w1 = [t for t in plan.tensors if t.kind == "expert" and t.role == "mlp_in"]
    assert w1 and all(t.std == pytest.approx(0.02, rel=1e-12) for t in w1)
    local.init_model(cfg, seed=SEED, policy="gpt2", out_dir=tmp_path, dtype="float32")
    ours = read_tensors(tmp_path)
    for t in w2:
        check_values(t.name, ours[t.name], 0.0, scaled, None, None, "gpt2 policy")


def test_bert_tf_policy_plans_vit(local):
    plan = local.plan(TINY["vit"], policy="bert-tf", tensors=True)
    by_name = {t.name: t for t in plan.tensors}
    for name in ("vit.embeddings.cls_token", "vit.embeddings.position_embeddings"):
        assert by_name[name].rule == "other: hf-default", by_name[name]
        assert by_name[name].std == pytest.approx(0.02)
    conv = by_name["vit.embeddings.patch_embeddings.projection.weight"]
    assert conv.kind == "conv" and conv.rule == "weight" and "trunc_normal" in conv.init
    assert all(t.rule in ("weight", "bias = 0", "norm weight = 1", "other: hf-default") for t in plan.tensors)


def test_xavier_policy_plans_t5(local):
    plan = local.plan(TINY["t5"], policy="xavier", tensors=True)
    linear = [t for t in plan.tensors if t.kind == "linear" and t.param == "weight"]
    assert linear
    for t in linear:
        assert t.rule == "linear xavier_uniform"
        assert t.std == pytest.approx(math.sqrt(2 / (t.fan_in + t.fan_out)), rel=1e-12), t.name
    norms = [t for t in plan.tensors if t.kind == "norm"]
    assert norms and all(t.init == "constant(1)" for t in norms)
    assert plan.tensor_count == len(plan.tensors) == len(case_spec("t5").tensors)


EXPERT_RULE = {"preset": "hf-default", "rules": [{"name": "experts", "match": {"kinds": ["expert"]}, "init": {"normal": {"std": 0.5}}}]}


@pytest.mark.parametrize("model_type", ["mixtral", "qwen2_moe", "deepseek_v3"])
def test_expert_rule_changes_only_experts(local, tmp_path, model_type):
    cfg = TINY[model_type]
    default = local.plan(cfg, seed=SEED, tensors=True)
    custom = local.plan(cfg, seed=SEED, policy=EXPERT_RULE, tensors=True)
    assert [t.name for t in default.tensors] == [t.name for t in custom.tensors]
    experts = {t.name for t in custom.tensors if t.kind == "expert"}
    assert experts
    for d, c in zip(default.tensors, custom.tensors):
        if c.name in experts:
            assert (c.rule, c.std) == ("experts", 0.5), c.name
        else:
            assert (c.rule, c.init, c.std) == (d.rule, d.init, d.std), c.name
    local.init_model(cfg, seed=SEED, out_dir=tmp_path / "default", dtype="float32")
    local.init_model(cfg, seed=SEED, policy=EXPERT_RULE, out_dir=tmp_path / "custom", dtype="float32")
    a, b = raw_tensors(tmp_path / "default"), raw_tensors(tmp_path / "custom")
    changed = {n for n in a if a[n] != b[n]}
    assert changed == experts


# --- 7. unsupported input: INVALID_ARGUMENT through a real server -----------------------------------

_MIXTRAL = TINY["mixtral"]

REJECTED = [
    pytest.param({"model_type": "no_such_model_xyz"}, "", ["spec.config.model_type", "no_such_model_xyz", "use a model_type"],
                 id="unknown-model-type"),
    pytest.param(TINY["llama"], "BertModel", ["spec.architecture", "'BertModel'", "use one of", "LlamaForCausalLM"],
                 id="bert-class-for-llama"),
    pytest.param(_MIXTRAL, "LlamaForCausalLM", ["spec.architecture", "'LlamaForCausalLM'", "use one of", "MixtralForCausalLM"],
                 id="llama-class-for-mixtral"),
    pytest.param({**TINY["llama"], "architectures": ["BertModel"]}, "", ["spec.config.architectures", "'BertModel'", "use one of",
                 "LlamaModel"], id="bert-class-in-llama-config"),
    pytest.param(_MIXTRAL, "NoSuchModel", ["spec.architecture", "use one of", "MixtralModel"], id="no-such-class"),
    pytest.param({**_MIXTRAL, "rope_scaling": {"rope_type": "bogus"}}, "", ["spec.config", "transformers", "bogus"],
                 id="transformers-cannot-build"),
    pytest.param({**TINY["gpt_neox"], "hidden_size": 66}, "", ["spec.config", "divisible"],
                 id="transformers-validator-rejects"),
    pytest.param({**_MIXTRAL, "vocab_size": "many"}, "", ["spec.config", "vocab_size"],
                 id="transformers-type-check-rejects"),
    pytest.param({**_MIXTRAL, "num_local_experts": 0}, "", ["spec.config", "cannot lay out", "fix the sizes"],
                 id="no-experts"),
]


@pytest.mark.parametrize(("config", "architecture", "needles"), REJECTED)
def test_unsupported_input_is_invalid_argument(client, config, architecture, needles):
    with pytest.raises(ModelInitError) as err:
        client.plan(config, architecture=architecture or None)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT, err.value
    for needle in needles:
        assert needle in err.value.details, (needle, err.value.details)


def test_head_classes_are_generic():
    """The heads tested above are not built-in classes: they exercise the generic path."""
    for cls, (model_type, prefix) in HEADS.items():
        spec = from_config(TINY[model_type], cls)
        assert spec.base_model_prefix == prefix
        assert (spec.transformers_version != "") == (cls not in FAMILIES[model_type].architectures)



def test_a_torch_below_transformers_floor_is_one_line_naming_both(monkeypatch):
    """transformers 5 disables its torch models below torch 2.6; a generic architecture then used to fail
    with "... is not a transformers class of model_type 'gemma2'; use one of:" and an empty list. Now
    one line says which transformers, which torch, and the torch it needs."""
    import transformers.utils

    from modelinit_server.architectures import meta_models

    monkeypatch.setattr(transformers.utils, "is_torch_available", lambda: False)
    for call in (meta_models.load_transformers, lambda: meta_models.config_of({"model_type": "gemma2"})):
        with pytest.raises(ValueError, match=rf"^spec: transformers {re.escape(transformers.__version__)} builds no model "
                                             rf"with torch {re.escape(torch.__version__)} \(it disables PyTorch below 2\.6\); "
                                             r"install torch >= 2\.6"):
            call()


@pytest.mark.parametrize("document, field", [
    ({"model_type": "bart", "num_hidden_layers": 100_000}, "encoder_layers"),  # BART's alias for its encoder's depth
    ({"model_type": "bart", "decoder_layers": 5_000}, "decoder_layers"),
    ({"model_type": "llava", "text_config": {"model_type": "llama", "num_hidden_layers": 2_000}}, "text_config.num_hidden_layers"),
])
def test_a_config_deeper_than_any_model_is_refused_before_it_is_built(document, field):
    """transformers constructs every layer to be read (about 10 ms each on the meta device), so a depth
    past MAX_LAYERS is refused before anything is built: a request's planning time stays bounded (a
    ``config`` fuzz target's timeout: fuzz/README.md)."""
    from modelinit_server.architectures.hf import MAX_LAYERS

    with pytest.raises(ValueError, match=rf"^spec\.config\.{re.escape(field)}: \d+ layers is more than the {MAX_LAYERS}"):
        from_config(document)
