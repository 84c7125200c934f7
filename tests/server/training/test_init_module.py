"""modelinit.init_module_: a materialized module filled in place with the files' exact bytes.

Single process: tiny Llama (float32, bfloat16) and Mixtral (fused experts) against the files
``Client().init_model`` writes; plain modules with a policy; errors. Several processes (gloo on
CPU, spawned): FSDP2, tensor parallel, FSDP x TP on a 2x2 mesh (``_StridedShard``), an uneven
vocabulary (97 rows) — each rank fills only its shards, and ``full_tensor()`` equals the files.
"""
from __future__ import annotations

import functools
import json
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

import modelinit  # noqa: E402
from modelinit_server.training import init_module_, strip_wrappers  # noqa: E402
from modelinit_server.training.fill import Filler  # noqa: E402

from tests.support.distributed import exit_rank, no_collectives, same_bytes, spawn  # noqa: E402
from tests.support.plain_module import POLICY, Plain  # noqa: E402

SEED = 1234

LLAMA = dict(model_type="llama", vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
MIXTRAL = dict(model_type="mixtral", vocab_size=97, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
               max_position_embeddings=64)


def _config(doc):
    doc = dict(doc)
    return transformers.AutoConfig.for_model(doc.pop("model_type"), **doc)


def _config_dict(model) -> dict:
    """What a user passes to modelinit for this model: its config, without the dtype."""
    cfg = {k: v for k, v in model.config.to_dict().items() if k not in ("dtype", "torch_dtype")}
    cfg["architectures"] = [type(model).__name__]
    return cfg


def _files(config: dict, dtype: str, out: pathlib.Path, policy=None) -> tuple[dict, str]:
    with modelinit.Client() as client:
        client.init_model(config, seed=SEED, dtype=dtype, out_dir=out, policy=policy)
    tensors = {}
    for f in sorted(out.glob("*.safetensors")):
        tensors.update(safetensors_torch.load_file(f))
    return tensors, json.loads((out / "modelinit.json").read_text())["fingerprint"]


def _fused_reference(files: dict, n_layers: int, n_experts: int) -> dict:
    """The files' per-expert tensors put where transformers 5 holds them in memory."""
    ref = dict(files)
    for layer in range(n_layers):
        p = f"model.layers.{layer}"
        e = f"{p}.block_sparse_moe.experts"
        ref[f"{p}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([files[f"{e}.{i}.w1.weight"], files[f"{e}.{i}.w3.weight"]]) for i in range(n_experts)])
        ref[f"{p}.mlp.experts.down_proj"] = torch.stack([files[f"{e}.{i}.w2.weight"] for i in range(n_experts)])
        ref[f"{p}.mlp.gate.weight"] = files[f"{p}.block_sparse_moe.gate.weight"]
    return ref


# --- one process ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_llama_equals_files(tmp_path, dtype):
    model = transformers.LlamaForCausalLM(_config(LLAMA)).to(getattr(torch, dtype))
    summary = init_module_(model, seed=SEED)
    files, fingerprint = _files(_config_dict(model), dtype, tmp_path)
    state = model.state_dict()
    assert set(state) == set(files)
    assert [k for k in state if not same_bytes(state[k], files[k])] == []
    assert summary.fingerprint == fingerprint
    assert summary.tensors == len(state) and summary.elements == sum(t.numel() for t in state.values())
    assert summary.dtypes == (dtype,) and summary.architecture == "LlamaForCausalLM"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_cuda_module_equals_files(tmp_path, dtype):
    """On a GPU the Triton kernels fill the parameters where they are; the bytes are the files' (made
    on the CPU), for whole tensors, fused experts and a column shard (the runs kernel)."""
    from modelinit_server.core.tensors import TensorSpec
    from modelinit_server.engine import Sampler

    for doc, cls in ((LLAMA, transformers.LlamaForCausalLM), (MIXTRAL, transformers.MixtralForCausalLM)):
        model = cls(_config(doc)).to(device="cuda", dtype=getattr(torch, dtype))
        summary = init_module_(model, seed=SEED)
        files, fingerprint = _files(_config_dict(model), dtype, tmp_path / cls.__name__)
        if cls is transformers.MixtralForCausalLM:
            files = _fused_reference(files, 2, 4)
        state = model.state_dict()
        assert [k for k in state if not same_bytes(state[k].cpu(), files[k])] == []
        assert summary.fingerprint == fingerprint
    spec, sampler = TensorSpec("w", (300, 64), kind="linear", role="mlp_out", param="weight"), Sampler("normal", std=0.02)
    whole, half = torch.empty(300, 64), torch.empty(300, 32, device="cuda")
    Filler("cpu").fill_piece(whole, [None, None], spec, sampler, (1, 2), "float32", (0, 0), (0, 1))
    Filler("auto").fill_piece(half, [None, np.arange(32, 64)], spec, sampler, (1, 2), "float32", (0, 0), (0, 1))
    assert torch.equal(half.cpu(), whole[:, 32:])


def test_tied_llama_filled_once(tmp_path):
    model = transformers.LlamaForCausalLM(_config({**LLAMA, "tie_word_embeddings": True}))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    summary = init_module_(model, seed=SEED)
    files, _ = _files(_config_dict(model), "float32", tmp_path)
    assert "lm_head.weight" not in files
    assert same_bytes(model.lm_head.weight, files["model.embed_tokens.weight"])
    assert summary.tensors == len(files)


@pytest.mark.parametrize("probe", ["views", "index probe"])
def test_mixtral_fused_experts_equal_per_expert_files(tmp_path, monkeypatch, probe):
    """Located on the meta device (the conversion's chunks and unbinds are views: no memory, any
    size; the index probe is refused by a cap of 0), and with the index probe (no views)."""
    from modelinit_server.training import hf_layout

    if probe == "views":
        monkeypatch.setattr(hf_layout, "MAX_PROBE_ELEMENTS", 0)
    else:
        monkeypatch.setattr(hf_layout, "all_views", lambda outputs, probe: False)
    model = transformers.MixtralForCausalLM(_config(MIXTRAL))
    summary = init_module_(model, seed=SEED)
    files, fingerprint = _files(_config_dict(model), "float32", tmp_path)
    assert "model.layers.0.block_sparse_moe.experts.3.w2.weight" in files  # the hub's per-expert layout
    ref = _fused_reference(files, 2, 4)
    state = model.state_dict()
    assert [k for k in state if not same_bytes(state[k], ref[k])] == []
    assert summary.fingerprint == fingerprint


class _Converter:
    """A stand-in for a transformers WeightConverter: its outputs are functions of its inputs."""

    def __init__(self, outputs):
        self.outputs, self.probes = outputs, []

    def add_tensor(self, target, name, pattern, probe):
        self.probes.append(probe)

    def convert(self, target, **kwargs):
        return {name: f(*self.probes) for name, f in self.outputs.items()}


def test_a_conversion_that_copies_is_located_with_the_index_probe(monkeypatch):
    """Outputs that are copies (not views of the probe) are located with an arange probe, within
    its cap; a non-block output is refused by name."""
    from modelinit_server.training import hf_layout

    model = transformers.LlamaForCausalLM(_config(LLAMA))
    w = [("w", "w")]
    halves = _Converter({"a": lambda p: p[:, 2:].clone(), "b": lambda p: [p[1:, :2].clone()]})
    boxes = hf_layout._locate(halves, "t", w, {"w": (3, 5)}, model)
    assert boxes == {"a": [("w", ((0, 2), (0, 1), (0, 0), (3, 3)))], "b": [("w", ((1, 0), (0, 1), (0, 0), (2, 2)))]}
    with pytest.raises(ValueError, match="'c' is not made of blocks of 'w'"):
        hf_layout._locate(_Converter({"c": lambda p: p.flip(0).clone()}), "t", w, {"w": (3, 5)}, model)
    monkeypatch.setattr(hf_layout, "MAX_PROBE_ELEMENTS", 14)
    with pytest.raises(ValueError, match="'w' is too large to locate"):
        hf_layout._locate(halves, "t", w, {"w": (3, 5)}, model)


def test_a_stored_tensor_made_of_several_in_memory_ones_is_located():
    """Nomic-BERT style: the stored ``Wqkv`` is q, k and v concatenated (here also stacked and
    transposed); each in-memory tensor is a box of it."""
    from modelinit_server.training import hf_layout

    model = transformers.LlamaForCausalLM(_config(LLAMA))
    inputs = [("q", "q"), ("k", "k"), ("v", "v")]
    shapes = {"q": (4, 3), "k": (2, 3), "v": (2, 3)}
    cat = _Converter({"qkv": lambda q, k, v: torch.cat([q, k, v], 0), "t": lambda q, k, v: torch.stack([k.T, v.T])})
    boxes = hf_layout._locate(cat, "t", inputs, shapes, model)
    assert boxes["qkv"] == [("q", ((0, 0), (0, 1), (0, 0), (4, 3))), ("k", ((0, 0), (0, 1), (4, 0), (2, 3))),
                            ("v", ((0, 0), (0, 1), (6, 0), (2, 3)))]
    assert boxes["t"] == [("k", ((0, 0), (-1, 1, 0), (0, 0, 0), (1, 3, 2))), ("v", ((0, 0), (-1, 1, 0), (1, 0, 0), (1, 3, 2)))]
    padded = _Converter({"qkv": lambda q, k, v: torch.cat([q, k, v, torch.full((1, 3), -1, dtype=q.dtype)], 0)})
    with pytest.raises(ValueError, match="'qkv' holds values that no in-memory tensor has"):
        hf_layout._locate(padded, "t", inputs, shapes, model)


def test_nomic_bert_fused_qkv_equals_the_files(tmp_path):
    """A real model whose stored ``attn.Wqkv`` is made of three in-memory tensors."""
    doc = dict(model_type="nomic_bert", vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, max_position_embeddings=64)
    model = transformers.AutoModel.from_config(_config(doc))
    summary = init_module_(model, seed=SEED)
    files, fingerprint = _files(_config_dict(model), "float32", tmp_path)
    assert "layers.0.attn.Wqkv.weight" in files or any(k.endswith("attn.Wqkv.weight") for k in files)
    qkv = next(v for k, v in files.items() if k.endswith("layers.0.attn.Wqkv.weight"))
    state = model.state_dict()
    got = torch.cat([state[f"layers.0.self_attn.{p}_proj.weight"] for p in "qkv"], 0)
    assert same_bytes(got, qkv)
    assert summary.fingerprint == fingerprint


#: Built from the census' shrunk default config of their type (tests/support/census.py): computed
#: tensors (SSM, sinusoidal, ±inf bounds), weight norm, GPT-1's Conv1D.
SHRUNK = ("mamba", "jamba", "qwen3_next", "pegasus", "wav2vec2", "openai-gpt", "gemma4_audio", "rwkv")
#: Taken from tests/support/generic_configs.py's hand-made configs.
HANDMADE_TYPES = ("mamba2", "nemotron_h")
EXTRA = {"nomic_bert": dict(model_type="nomic_bert", vocab_size=100, hidden_size=32, intermediate_size=64,
                            num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64),
         # logit_scale: a 0-d parameter its constructor sets (torch.tensor(2.6592)), never _init_weights
         "clip": dict(model_type="clip", projection_dim=32,
                      text_config=dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                       num_attention_heads=4, max_position_embeddings=32, bos_token_id=0,
                                       eos_token_id=1, pad_token_id=1),
                      vision_config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                         num_attention_heads=4, image_size=32, patch_size=8)),
         "dinov2": dict(model_type="dinov2", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, image_size=32, patch_size=8)}


def _family_names() -> list[str]:
    """The families of the generic tests and the ones above, by name only: collecting them builds
    no model (each worker collects every module)."""
    from tests.support.generic_configs import TINY as GENERIC

    return sorted({*GENERIC, *EXTRA, *SHRUNK, *HANDMADE_TYPES})


@functools.cache
def _family(name: str) -> dict:
    """The config document of family ``name``; a shrunk type transformers no longer builds fails here, by name."""
    from tests.support.generic_configs import HANDMADE, TINY as GENERIC

    if name in SHRUNK:
        from tests.support.census import candidate

        found = candidate(name)
        assert not isinstance(found, str), f"{name}: transformers builds no model from its shrunk default config: {found}"
        return {k: v for k, v in found[1].items() if k != "architectures"}
    if name in HANDMADE_TYPES:
        return {k: v for k, v in HANDMADE[name].items() if k != "architectures"}
    return EXTRA.get(name) or GENERIC[name]


@pytest.mark.parametrize("family", _family_names())
def test_every_family_equals_what_save_pretrained_writes(tmp_path, family):
    """For each family of the generic tests (MoE, MLA, encoder-decoder, vision, fused qkv): the
    module init_module_ fills, saved by transformers itself, is byte for byte modelinit's files."""
    model = transformers.AutoModel.from_config(_config(_family(family)))
    init_module_(model, seed=SEED)
    files, _ = _files(_config_dict(model), "float32", tmp_path / "ours")
    model.save_pretrained(tmp_path / "theirs")
    theirs = {}
    for f in sorted((tmp_path / "theirs").glob("*.safetensors")):
        theirs.update(safetensors_torch.load_file(f))
    assert sorted(theirs) == sorted(files)
    assert [k for k in files if not same_bytes(theirs[k], files[k])] == []
    if family == "clip":  # the constructor's value, as transformers' from_config leaves it
        assert files["logit_scale"].shape == () and files["logit_scale"].item() == torch.tensor(2.6592).item()


def test_constructor_records_follow_what_the_constructor_writes():
    """Values a model's constructor sets and _init_weights never touches: constants (and elementwise
    functions of them), torch.nn.init calls, in-place draws, randn scaled by a number; anything else
    is a refusal naming what computed it."""
    import math

    from modelinit_server.architectures.constructor import constructor_records

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.tensor(2.5))
            self.gamma = torch.nn.Parameter(1e-5 * torch.ones(4))
            self.halved = torch.nn.Parameter(torch.full((2, 2), 3.0) / 2)
            self.changed = torch.nn.Parameter(torch.ones(3))
            self.changed.data.mul_(2.0)
            self.softplus_inv = torch.nn.Parameter(torch.log(torch.exp(torch.tensor(0.8)) - 1))
            self.drawn = torch.nn.Parameter(torch.empty(3))
            self.conv1d = torch.nn.Parameter(torch.empty(8, 24))
            torch.nn.init.normal_(self.conv1d, std=0.02)
            self.masked = torch.nn.Parameter(torch.Tensor(16).uniform_())
            self.latents = torch.nn.Parameter(torch.randn(4, 8) * 0.5)
            self.linear = torch.nn.Linear(6, 10)
            self.cumsum = torch.nn.Parameter(torch.ones(5).cumsum(0))
            self.summed = torch.nn.Parameter(torch.empty(5))
            self.summed.data.copy_(torch.arange(5.0))

    with torch.device("meta"), constructor_records() as built:
        m = M()
    got = {n: built.get(p.untyped_storage()._cdata) for n, p in m.named_parameters()}
    kind = {n: (r.init.kind if r is not None and r.init is not None else (r.refusal if r is not None else None))
            for n, r in got.items()}
    assert got["scale"].init.value == 2.5 and got["halved"].init.value == 1.5
    assert got["gamma"].init.value == pytest.approx(1e-5, rel=1e-7)  # evaluated as torch does, in float32
    assert got["changed"].init.value == 2.0
    assert got["softplus_inv"].init.value == pytest.approx(math.log(math.exp(0.8) - 1), rel=1e-6)
    assert kind["drawn"] is None and kind["cumsum"] is None  # nothing known: "never writes"
    assert (got["conv1d"].init.kind, got["conv1d"].init.std) == ("normal", 0.02)
    assert (got["masked"].init.kind, got["masked"].init.low, got["masked"].init.high) == ("uniform", 0.0, 1.0)
    assert (got["latents"].init.kind, got["latents"].init.std) == ("normal", 0.5)
    bound = 1 / math.sqrt(6)  # nn.Linear's kaiming_uniform(a=sqrt(5)) and its bias
    assert got["linear.weight"].init.kind == "uniform" and got["linear.weight"].init.high == pytest.approx(bound)
    assert got["linear.bias"].init.kind == "uniform" and got["linear.bias"].init.high == pytest.approx(bound)
    assert "the constructor computes it" in kind["summed"]


def test_base_class_shares_the_head_classes_backbone():
    """Version 2 names: the backbone's bytes do not depend on the head class around it."""
    head = transformers.LlamaForCausalLM(_config(LLAMA))
    base = transformers.LlamaModel(_config(LLAMA))
    init_module_(head, seed=SEED)
    init_module_(base, seed=SEED)
    for name, t in base.state_dict().items():
        assert same_bytes(t, head.state_dict()["model." + name]), name


def test_wrappers_are_ignored(tmp_path):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    model = transformers.LlamaForCausalLM(_config(LLAMA))
    model.model.layers[0] = checkpoint_wrapper(model.model.layers[0])
    assert any("_checkpoint_wrapped_module" in k for k, _ in model.named_parameters())
    init_module_(model, seed=SEED)
    files, _ = _files(_config_dict(model), "float32", tmp_path)
    state = {strip_wrappers(k): v for k, v in model.state_dict().items()}
    assert [k for k in files if not same_bytes(state[k], files[k])] == []
    assert strip_wrappers("_orig_mod.model._fsdp_wrapped_module.layers.0.w") == "model.layers.0.w"


#: In a fresh interpreter: a small plain module filled under ``auto``; whether numba was imported, and
#: the SHA-256 of its state.
_SMALL_FILL = """
import hashlib, sys, torch
from modelinit_server.training import init_module_
from tests.support.plain_module import POLICY, Plain
m = Plain()
init_module_(m, seed=1234, policy=POLICY)
state = b"".join(t.detach().reshape(-1).view(torch.uint8).numpy().tobytes() for _, t in sorted(m.state_dict().items()))
print("numba" in sys.modules, hashlib.sha256(state).hexdigest())
"""


def test_a_small_module_loads_no_kernel_and_gets_the_kernels_bytes():
    """Under ``auto`` (the default), a small module (engine.backends.SmallJobs) is filled by the numpy
    reference without loading numba's kernels; the bytes are the CPU kernel's."""
    import hashlib
    import subprocess
    import sys

    from tests.support import REPO

    pytest.importorskip("numba")
    done = subprocess.run([sys.executable, "-c", _SMALL_FILL], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    numba_imported, digest = done.stdout.split()[-2:]
    kernel = Plain()
    init_module_(kernel, seed=1234, policy=POLICY, device="cpu")
    state = b"".join(t.detach().reshape(-1).view(torch.uint8).numpy().tobytes() for _, t in sorted(kernel.state_dict().items()))
    assert numba_imported == "False"
    assert digest == hashlib.sha256(state).hexdigest()


def test_plain_module_with_policy():
    a, b = Plain(), Plain()
    b.head.weight.data.fill_(7)
    s = init_module_(a, seed=SEED, policy=POLICY)
    init_module_(b, seed=SEED, policy=POLICY)
    assert all(same_bytes(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert s.skipped == ("steps",) and s.tensors == 10
    assert torch.all(a.embed.weight[0] == 0) and a.embed.weight[1:].std() > 0.5
    assert torch.all(a.layers[1].attn_norm.weight == 1) and torch.all(a.layers[0].proj.bias == 0)
    assert a.head.weight.abs().max() <= 0.04 and a.layers[1].proj.weight.abs().max() <= 0.02
    c = Plain()
    init_module_(c, seed=SEED + 1, policy=POLICY)
    assert not torch.equal(a.head.weight, c.head.weight)


def test_plain_module_unmatched_parameter_is_named():
    with pytest.raises(ValueError, match=r"no rule matches tensor 'scale'"):
        init_module_(Plain(extra=True), seed=SEED, policy=POLICY)


@pytest.fixture()
def world_of_one(tmp_path):
    """A gloo process group of this process alone (DDP and FSDP1 need one)."""
    import torch.distributed as d

    if not d.is_available() or not d.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    d.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    d.destroy_process_group()


@pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`")
def test_ddp_and_fsdp1_wrapped_models_are_the_models_inside(world_of_one, tmp_path):
    """DDP's ``module.`` prefix and FSDP1's wrappers (one rank: whole tensors) are seen through: the
    transformers model inside is recognized and gets the files' bytes; FSDP1's flat parameters, and
    a sharded FSDP1, are refused with what to do instead."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.nn.parallel import DistributedDataParallel as DDP

    files, fingerprint = _files(_config_dict(transformers.LlamaForCausalLM(_config(LLAMA))), "float32", tmp_path)
    for wrap in (lambda m: DDP(m), lambda m: FSDP(m, device_id=torch.device("cpu"), use_orig_params=True)):
        inner = transformers.LlamaForCausalLM(_config(LLAMA))
        summary = init_module_(wrap(inner), seed=SEED)
        assert summary.architecture == "LlamaForCausalLM" and summary.fingerprint == fingerprint
        state = inner.state_dict()
        assert [k for k in files if not same_bytes(state[k], files[k])] == []
    flat = FSDP(transformers.LlamaForCausalLM(_config(LLAMA)), device_id=torch.device("cpu"), use_orig_params=False)
    with pytest.raises(ValueError, match="FSDP1 flat parameter.*fully_shard"):
        init_module_(flat, seed=SEED)

    class FullyShardedDataParallel(torch.nn.Module):  # what a sharded FSDP1 looks like to the check
        sharding_strategy = type("S", (), {"name": "FULL_SHARD"})()

    with pytest.raises(ValueError, match=r"FSDP1 \(FullyShardedDataParallel, FULL_SHARD\)"):
        init_module_(FullyShardedDataParallel(), seed=SEED)


def test_a_pipeline_stage_is_filled_with_partial(tmp_path):
    """A stage that holds layer 1 and the head only (the others left out, names kept, as torchtitan's
    pipeline split does): partial=True fills what it holds with the whole model's bytes."""
    model = transformers.LlamaForCausalLM(_config(LLAMA))
    files, fingerprint = _files(_config_dict(model), "float32", tmp_path)
    model.model.layers[0] = torch.nn.Identity()
    model.model.embed_tokens = None
    with pytest.raises(ValueError, match="lacks tensors the architecture stores.*partial=True"):
        init_module_(model, seed=SEED)
    summary = init_module_(model, seed=SEED, partial=True)
    state = model.state_dict()
    assert state and all(k.startswith(("model.layers.1.", "model.norm.", "lm_head.")) for k in state)
    assert [k for k in state if not same_bytes(state[k], files[k])] == []
    assert summary.missing == len(files) - len(state) and summary.fingerprint == fingerprint


def test_a_resized_parameter_is_refused():
    model = transformers.LlamaForCausalLM(_config(LLAMA))
    model.model.norm.weight = torch.nn.Parameter(torch.empty(5))
    with pytest.raises(ValueError, match=r"'model.norm.weight' has shape \[5\], but LlamaForCausalLM .* has \[32\]"):
        init_module_(model, seed=SEED)


def test_meta_module_is_refused():
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(_config(LLAMA))
    with pytest.raises(ValueError, match=r"meta device; materialize first with module.to_empty\(device=...\)"):
        init_module_(model, seed=SEED)


def test_a_quantized_weight_is_refused_by_name():
    """A weight Transformer Engine keeps in FP8 (its Float8Tensor reports bfloat16 but stores FP8
    bytes): refused, naming it, before anything is written."""
    model = transformers.LlamaForCausalLM(_config(LLAMA)).to(torch.bfloat16)
    float8 = type("Float8Tensor", (torch.Tensor,), {"__module__": "transformer_engine.pytorch.tensor.float8_tensor"})
    weight = model.model.layers[0].mlp.up_proj.weight
    model.model.layers[0].mlp.up_proj.weight = torch.nn.Parameter(torch.Tensor._make_subclass(float8, weight.detach()))
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"^module: 'model\.layers\.0\.mlp\.up_proj\.weight' is Transformer Engine's "
                                         r"Float8Tensor, whose bytes are not the torch\.bfloat16 it reports .*build the "
                                         r"model with its weights in bfloat16"):
        init_module_(model, seed=SEED)
    assert all(same_bytes(a, b.detach()) for a, b in zip(before, model.parameters()))


def test_dtype_check():
    model = transformers.LlamaForCausalLM(_config(LLAMA))
    with pytest.raises(ValueError, match="is float32, not bfloat16"):
        init_module_(model, seed=SEED, dtype="bfloat16")


def test_any_local_block_equals_the_slice_of_the_whole():
    """The piece filler on hand-made index sets (what a shard holds), fused boxes included."""
    from modelinit_server.engine import Sampler

    rng = np.random.default_rng(0)
    sampler = Sampler("normal", std=0.02)
    shape = (4, 10, 6)
    whole = torch.empty(shape)
    filler = Filler("auto")
    from modelinit_server.core.tensors import TensorSpec

    spec = TensorSpec("w", shape, kind="linear", role="qkv", param="weight")
    filler.fill_piece(whole, [None] * 3, spec, sampler, (1, 2), "float32", (0, 0, 0), (0, 1, 2))
    for _ in range(20):
        sets = [np.sort(rng.choice(n, size=rng.integers(1, n + 1), replace=False)) for n in shape]
        local = torch.full([len(s) for s in sets], float("nan"))
        filler.fill_piece(local, sets, spec, sampler, (1, 2), "float32", (0, 0, 0), (0, 1, 2))
        assert torch.equal(local, whole[np.ix_(*sets)])
    # a [5, 6] tensor stored at [2, 5:10, :] of a fused [4, 10, 6] one, filled from shards
    part = TensorSpec("p", (5, 6), kind="expert", role="mlp_in", param="weight")
    ref = torch.empty(5, 6)
    filler.fill_piece(ref, [None] * 2, part, sampler, (3, 4), "float32", (0, 0), (0, 1))
    sets = [np.array([1, 2]), np.array([0, 3, 6, 7, 9]), np.array([1, 2, 3])]
    local = torch.full([2, 5, 3], float("nan"))
    filler.fill_piece(local, sets, part, sampler, (3, 4), "float32", (2, 5, 0), (1, 2))
    assert torch.equal(local[1, 2:], ref[[1, 2, 4]][:, [1, 2, 3]])
    assert torch.isnan(local[0]).all() and torch.isnan(local[1, :2]).all()
    # the other way round: a [3, 6] module tensor is rows 4:7 of a stored [10, 6] one (a fused qkv),
    # shards of it included
    fused = TensorSpec("qkv", (10, 6), kind="linear", role="qkv", param="weight")
    ref = torch.empty(10, 6)
    filler.fill_piece(ref, [None] * 2, fused, sampler, (5, 6), "float32", (0, 0), (0, 1))
    for sets in ([None, None], [np.array([0, 2]), None], [np.array([1]), np.array([0, 4, 5])]):
        local = torch.full([3 if s is None else len(s) for s in sets[:1]] + [6 if sets[1] is None else len(sets[1])],
                           float("nan"))
        filler.fill_piece(local, sets, fused, sampler, (5, 6), "float32", (0, 0), (0, 1), (4, 0), (3, 6))
        rows = np.arange(4, 7) if sets[0] is None else 4 + sets[0]
        cols = np.arange(6) if sets[1] is None else sets[1]
        assert torch.equal(local, ref[np.ix_(rows, cols)])


def test_a_column_shard_is_one_launch(monkeypatch):
    """A row-wise TP shard of a matrix (half of every row) is one run per row: all of them go to the
    kernel in one call, which shares them among its threads (not one call per row)."""
    from modelinit_server.core.tensors import TensorSpec
    from modelinit_server.engine import Sampler, cpu

    if not cpu.available():
        pytest.skip("numba is not installed")
    calls = []
    real = cpu.generate_runs_into
    monkeypatch.setattr(cpu, "generate_runs_into", lambda out, *a, **k: (calls.append(len(a[2])), real(out, *a, **k)))
    filler = Filler("cpu")
    sampler, spec = Sampler("normal", std=0.02), TensorSpec("w", (300, 64), kind="linear", role="mlp_out", param="weight")
    whole, local = torch.empty(300, 64), torch.empty(300, 32)
    filler.fill_piece(whole, [None, None], spec, sampler, (1, 2), "float32", (0, 0), (0, 1))
    filler.fill_piece(local, [None, np.arange(32, 64)], spec, sampler, (1, 2), "float32", (0, 0), (0, 1))
    assert calls == [1, 300]
    assert torch.equal(local, whole[:, 32:])


# --- several processes ------------------------------------------------------------------------

dist = pytest.importorskip("torch.distributed")
needs_dist = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")



def _tp_plan(model):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {"model.embed_tokens": RowwiseParallel(), "lm_head": ColwiseParallel()}
    for i in range(len(model.model.layers)):
        for n in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            plan[f"model.layers.{i}.{n}"] = ColwiseParallel()
        for n in ("self_attn.o_proj", "mlp.down_proj"):
            plan[f"model.layers.{i}.{n}"] = RowwiseParallel()
    return plan


def _build(kind: str, layout: str, world: int, device: str = "cpu"):
    """A model built on meta, parallelized, then materialized on ``device`` (torchtitan's order).
    ``layout``: ``fsdp``/``tp`` over all ranks (1-D mesh), ``fsdp2``/``tp2`` over 2 (one of the two
    groups of a 2x2 mesh: each group shards on its own, as a world of 2 would), ``fsdp_tp`` (2x2)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    if kind == "plain":
        with torch.device("meta"):
            model = Plain(vocab=97)
        mesh = init_device_mesh(device, (world,), mesh_dim_names=("dp",))
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        model.to_empty(device=device)
        return model
    doc = MIXTRAL if kind == "mixtral" else LLAMA
    with torch.device("meta"):
        model = (transformers.MixtralForCausalLM if kind == "mixtral" else transformers.LlamaForCausalLM)(_config(doc))
    if kind == "llama_bf16":
        model = model.to(torch.bfloat16)
    if layout in ("fsdp", "tp"):
        mesh = init_device_mesh(device, (world,), mesh_dim_names=(layout,))
        dp, tp = (mesh, None) if layout == "fsdp" else (None, mesh)
    else:
        mesh = init_device_mesh(device, (world // 2, 2), mesh_dim_names=("dp", "tp"))
        # fsdp2 / tp2: the 2 ranks of one "tp" row (a group of 2)
        dp, tp = {"fsdp2": (mesh["tp"], None), "tp2": (None, mesh["tp"]), "fsdp_tp": (mesh["dp"], mesh["tp"])}[layout]
    if tp is not None:
        parallelize_module(model, tp, _tp_plan(model))
    if dp is not None:
        for layer in model.model.layers:
            fully_shard(layer, mesh=dp)
        fully_shard(model, mesh=dp)
    model.to_empty(device=device)
    return model


def _worker(rank: int, world: int, init_file: str, cases: list, refs: dict):
    import torch.distributed as d
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import _StridedShard

    d.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        for kind, layout in cases:
            model = _build(kind, layout, world)
            with no_collectives():
                summary = init_module_(model, seed=SEED)
            state = model.state_dict()
            assert any(isinstance(t, DTensor) for t in state.values())
            if layout == "fsdp_tp":
                assert any(isinstance(p, _StridedShard) for t in state.values() if isinstance(t, DTensor) for p in t.placements)
            if world > 1:
                assert summary.elements < summary.global_elements  # each rank wrote its shards only
            ref = torch.load(refs[kind])
            for name, t in state.items():
                if name == "steps":
                    continue
                full = t.full_tensor() if isinstance(t, DTensor) else t
                if rank == 0:
                    assert same_bytes(full, ref[name]), (kind, layout, name, getattr(t, "placements", None))
            d.barrier()
        exit_rank()  # done: no teardown (it has aborted a rank after every check passed)
    finally:
        d.destroy_process_group()


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Each model's files, as the in-memory tensors (fused experts fused), saved for the ranks."""
    out = tmp_path_factory.mktemp("refs")
    paths = {}
    for kind, doc in (("llama", LLAMA), ("llama_bf16", LLAMA), ("mixtral", MIXTRAL)):
        model_cls = transformers.MixtralForCausalLM if kind == "mixtral" else transformers.LlamaForCausalLM
        with torch.device("meta"):
            model = model_cls(_config(doc))
        files, _ = _files(_config_dict(model), "bfloat16" if kind == "llama_bf16" else "float32", out / kind)
        if kind == "mixtral":
            files = _fused_reference(files, 2, 4)
        paths[kind] = str(out / f"{kind}.pt")
        torch.save(files, paths[kind])
    plain = Plain(vocab=97)
    init_module_(plain, seed=SEED)  # no files for a plain module: one device is the reference (hf-default rules)
    paths["plain"] = str(out / "plain.pt")
    torch.save(plain.state_dict(), paths["plain"])
    return paths


def _spawn(world: int, cases: list, refs: dict, tmp_path):
    spawn(_worker, (world, str(tmp_path / "pg"), cases, refs), world)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_dtensors_of_a_world_of_one_equal_files(tmp_path, references):
    """On a GPU, under an NCCL group of this process alone: FSDP2 and TP DTensors (one shard: the
    whole tensor, through the DTensor path) of Llama (f32, bf16), Mixtral's fused experts and a plain
    module are filled by the Triton kernels with the CPU files' bytes."""
    import torch.distributed as d
    from torch.distributed.tensor import DTensor

    if not d.is_available() or not d.is_nccl_available():
        pytest.skip("torch.distributed with NCCL is not available")
    d.init_process_group("nccl", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        for kind, layout in (("llama", "fsdp"), ("llama", "tp"), ("llama_bf16", "tp"), ("mixtral", "fsdp"),
                             ("plain", "fsdp")):
            model = _build(kind, layout, 1, device="cuda")
            init_module_(model, seed=SEED)
            state = model.state_dict()
            assert any(isinstance(t, DTensor) for t in state.values())
            ref = torch.load(references[kind])
            bad = [n for n, t in state.items() if n != "steps"
                   and not same_bytes((t.full_tensor() if isinstance(t, DTensor) else t).cpu(), ref[n])]
            assert bad == [], (kind, layout, bad)
    finally:
        d.destroy_process_group()


@pytest.mark.slow
@needs_dist
def test_sharded_models_equal_files(tmp_path, references):
    """One world of 4 processes (their imports dominate the cost; sizes 2 also run here as the
    2-rank groups of a 2x2 mesh, each sharding on its own as a world of 2 would): FSDP2
    and TP over 4 ranks (97 vocab rows: 25, 25, 25, 22) and over groups of 2 (49, 48), fused
    experts sharded over 2 and 4, FSDP x TP on a 2x2 mesh (``_StridedShard``), a plain module
    under FSDP2 against its single-device init. No rank communicates while it fills."""
    cases = [("llama", "fsdp"), ("llama", "tp"), ("llama", "fsdp2"), ("llama", "tp2"), ("llama", "fsdp_tp"),
             ("llama_bf16", "fsdp_tp"), ("mixtral", "fsdp"), ("mixtral", "fsdp2"), ("plain", "fsdp")]
    _spawn(4, cases, references, tmp_path)


@pytest.mark.slow
@needs_dist
def test_world_of_two(tmp_path, references):
    """A world of 2 processes: FSDP2 and TP on a 1-D mesh, the vocabulary split 49/48, bfloat16 too."""
    _spawn(2, [("llama", "fsdp"), ("llama", "tp"), ("llama_bf16", "fsdp"), ("llama_bf16", "tp")], references, tmp_path)


@pytest.mark.slow
@needs_dist
def test_world_of_one(tmp_path, references):
    """A world of 1: DTensors on a 1-rank mesh hold everything (Shard over one rank)."""
    _spawn(1, [("llama", "fsdp"), ("llama_bf16", "tp")], references, tmp_path)


def test_every_summary_field_is_documented():
    """docs/training.md's list under "The result, `InitSummary`" names every field a caller gets."""
    import dataclasses

    from modelinit_server.training import InitSummary
    from tests.support import REPO

    text = (REPO / "docs" / "training.md").read_text(encoding="utf-8")
    listed = text[text.index("The result, `InitSummary`"):text.index("Errors are `ValueError`s")]
    assert [f.name for f in dataclasses.fields(InitSummary) if f"`{f.name}`" not in listed] == []
