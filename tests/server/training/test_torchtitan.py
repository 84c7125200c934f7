"""``init_module_`` on a torchtitan model (issue 33: Llama 3, Qwen3 dense and MoE, DeepSeek-V3):
filled in place with the bytes of the Hugging Face folder ``modelinit init`` writes for the config
it corresponds to, at every layout, without communicating.

The reference is that folder read back through torchtitan's own ``StateDictAdapter.from_hf`` (q/k
rows permuted for RoPE) and the model's own load hook (``wq``/``wk``/``wv`` fused into ``wqkv``,
grouped per KV head): what torchtitan itself loads from a Hugging Face checkpoint. Layouts: one
device (float32, bfloat16, two policies), FSDP2 and tensor parallel over 2 ranks, FSDP x TP on a
2x2 mesh (``_StridedShard``), by hand and through torchtitan's own ``parallelize_llama``; expert
parallel through ``parallelize_qwen3`` and ``parallelize_deepseekv3``; the stages of torchtitan's own
pipeline split. Each rank fills only its shards. Bad input: a spec the model does not
match, a spec for a model that has its own, a pipeline stage without ``partial=True``, no spec for a
family modelinit derives no config for (test_torchtitan_config.py derives the others').
"""
from __future__ import annotations

import pathlib

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
safetensors_torch = pytest.importorskip("safetensors.torch")

import modelinit  # noqa: E402

from tests.support.distributed import exit_rank, no_collectives, same_bytes, spawn  # noqa: E402
from tests.support.stacks import install_torchtitan  # noqa: E402
from tests.support.torchtitan_models import (DEEPSEEK_V3, HF, QWEN3, QWEN3_MOE, SEED, flavor_model,  # noqa: E402
                                             folder_as_loaded, meta_model, titan_config, titan_parallelized)


@pytest.fixture(scope="module", autouse=True)
def torchtitan():
    return install_torchtitan()


def _dtype_of(model, dtype: str):
    return model.to(getattr(torch, dtype)) if dtype != "float32" else model


def _loaded(model_meta, files: dict):
    """``files`` (a Hugging Face state dict) as torchtitan loads them into a model like ``model_meta``."""
    from modelinit_server.training.torchtitan_layout import _adapter

    model = model_meta.to_empty(device="cpu")
    model.load_state_dict(_adapter(model).from_hf(files), strict=False)  # the MoE's expert bias is not in the files
    return {n: p.detach().clone() for n, p in model.named_parameters()}


_FOLDERS: dict[str, str] = {}


def _folder_reference(tmp_path_factory, flavor: str, hf: dict) -> str:
    """The folder of (hf, SEED) as torchtitan loads it into the flavor's model, saved once per session
    (the one-device and the expert-parallel tests share it): the path of the saved parameters."""
    if flavor not in _FOLDERS:
        out = tmp_path_factory.mktemp(f"hf-{flavor}")
        with modelinit.Client() as c:
            c.init_model(hf, seed=SEED, out_dir=out / "hf")
        files = {}
        for f in (out / "hf").glob("*.safetensors"):
            files.update(safetensors_torch.load_file(f))
        torch.save(_loaded(flavor_model(flavor), files), out / "ref.pt")
        _FOLDERS[flavor] = str(out / "ref.pt")
    return _FOLDERS[flavor]


@pytest.mark.parametrize("flavor, hf", [("debugmodel", QWEN3), ("debugmodel_moe", QWEN3_MOE), ("deepseek_v3", DEEPSEEK_V3)],
                         ids=["qwen3", "qwen3-moe", "deepseek-v3"])
def test_qwen3_and_deepseek_v3_equal_their_folders(tmp_path_factory, flavor, hf):
    model = flavor_model(flavor).to_empty(device="cpu")
    summary = modelinit.init_module_(model, seed=SEED, spec=hf)
    ref = torch.load(_folder_reference(tmp_path_factory, flavor, hf))
    got = dict(model.named_parameters(remove_duplicate=False))  # a tied tensor under each name
    assert [n for n in ref if not same_bytes(got[n].detach(), ref[n])] == []
    if flavor == "debugmodel_moe":  # torchtitan's own runtime state, set by its own code: zeros
        assert summary.stack_buffers == ("layers.0.moe.expert_bias_E", "layers.1.moe.expert_bias_E")
        assert all(not b.any() for n, b in model.named_buffers() if "expert" in n)
    if flavor == "deepseek_v3":  # its router bias is in the Hugging Face layout: filled as a weight, not the stack's
        assert summary.stack_buffers == ()
    if flavor == "debugmodel":  # tied: to_empty untied the two, init_module_ ties them again as init_states does
        assert model.tok_embeddings.weight is model.lm_head.weight
    # each tensor the model holds counted once (the tie is made before the tensors are listed)
    filled = {id(p): p.numel() for p in model.parameters()}
    for name, b in model.named_buffers():
        owner, _, leaf = name.rpartition(".")
        persistent = leaf not in model.get_submodule(owner)._non_persistent_buffers_set
        if persistent and b.is_floating_point() and name not in summary.stack_buffers:
            filled[id(b)] = b.numel()
    assert (summary.tensors, summary.elements) == (len(filled), sum(filled.values()))


@pytest.mark.parametrize("dtype, policy", [("float32", None), ("bfloat16", None), ("float32", "torchtitan-llama3")])
def test_one_device_equals_the_hugging_face_folder_as_torchtitan_loads_it(tmp_path, dtype, policy):
    model = _dtype_of(meta_model().to_empty(device="cpu"), dtype)
    summary = modelinit.init_module_(model, seed=SEED, spec=HF, policy=policy)
    ref = folder_as_loaded(tmp_path, dtype, policy)
    got = dict(model.named_parameters())
    assert sorted(got) == sorted(ref)
    assert [n for n in ref if not same_bytes(got[n].detach(), ref[n])] == []
    assert summary.architecture == "LlamaForCausalLM" and summary.missing == 0
    assert summary.global_elements == sum(p.numel() for p in got.values())
    # The RoPE tables (buffers, not weights) are torchtitan's own, as its init_states computes them.
    fresh = titan_config().build()  # computed by torchtitan, in its dtypes (complex RoPE tables stay complex)
    assert all(torch.equal(b, dict(fresh.named_buffers())[n]) for n, b in model.named_buffers())


def _build(layout: str, world: int):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    titan = {"titan_fsdp": {}, "titan_tp": {"tensor_parallel_degree": 2},
             "titan_tp_full": {"tensor_parallel_degree": 2, "backend": "full_dtensor"},
             "titan_fsdp_tp": {"tensor_parallel_degree": 2},
             "titan_ep_qwen3_moe": {"expert_parallel_degree": 2}, "titan_ep_deepseek_v3": {"expert_parallel_degree": 2}}
    if layout in titan:  # torchtitan's own parallelize function, as its trainer calls it
        moe = {"titan_ep_qwen3_moe": "debugmodel_moe", "titan_ep_deepseek_v3": "deepseek_v3"}
        config = flavor_model(moe[layout], built=False) if layout in moe else titan_config()
        return titan_parallelized(config, world, **titan[layout]).to_empty(device="cpu")
    model = meta_model()
    tp_plan = {"attention.qkv_linear.wqkv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
               "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
               "feed_forward.w2": RowwiseParallel()}
    if layout == "fsdp":
        mesh = init_device_mesh("cpu", (world,))
        for layer in model.layers.values():
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif layout == "tp":
        mesh = init_device_mesh("cpu", (world,))
        for layer in model.layers.values():
            parallelize_module(layer, mesh, tp_plan)
    elif layout == "fsdp_tp":
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
        for layer in model.layers.values():
            parallelize_module(layer, mesh["tp"], tp_plan)
            fully_shard(layer, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    return model.to_empty(device="cpu")


#: The spec each layout's model corresponds to.
SPECS = {"titan_ep_qwen3_moe": QWEN3_MOE, "titan_ep_deepseek_v3": DEEPSEEK_V3}


def _worker(rank: int, world: int, init_file: str, layouts: list, refs: dict):
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        for layout in layouts:
            ref = torch.load(refs[layout])
            model = _build(layout, world)
            with no_collectives():
                summary = modelinit.init_module_(model, seed=SEED, spec=SPECS.get(layout, HF))
            assert summary.elements < summary.global_elements, (layout, summary)  # each rank wrote its shards only
            params = dict(model.named_parameters())
            assert any(isinstance(p, DTensor) for p in params.values())
            if layout == "fsdp_tp":
                assert any(isinstance(pl, _StridedShard) for p in params.values() if isinstance(p, DTensor)
                           for pl in p.placements)
            if layout.startswith("titan_tp") or layout == "titan_fsdp_tp":  # torchtitan's own TP did shard
                wqkv = params["layers.0.attention.qkv_linear.wqkv.weight"]
                assert Shard(0) in wqkv.placements[wqkv.device_mesh.mesh_dim_names.index("tp"):], (layout, wqkv.placements)
                cache = model.layers["0"].attention.rope.cache  # a DTensor buffer, set by torchtitan's own code
                assert isinstance(cache, DTensor) and torch.equal(cache.to_local(), _fresh_rope_cache())
            if layout.startswith("titan_ep"):  # the routed experts, sharded along the expert dim by torchtitan's EP
                for name in ("w1_EFD", "w2_EDF", "w3_EFD"):
                    w = params[f"layers.1.moe.routed_experts.inner_experts.{name}"]
                    ep = w.device_mesh.mesh_dim_names.index("ep")
                    assert w.placements[ep] == Shard(0) and w.to_local().shape[0] == w.shape[0] // 2, (layout, w.placements)
            full = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach() for n, p in params.items()}
            if rank == 0:
                bad = [n for n in ref if not same_bytes(full[n], ref[n])]
                assert bad == [], (layout, bad)
            dist.barrier()
        exit_rank()  # done: no teardown (it has aborted a rank after every check passed)
    finally:
        dist.destroy_process_group()


def _fresh_rope_cache():
    """The RoPE table of layer 0 as torchtitan computes it for the unsharded model."""
    with torch.device("meta"):
        model = titan_config().build()
    rope = model.layers["0"].attention.rope
    rope.to_empty(device="cpu")
    rope.init_states()
    return rope.cache


def _spawn(world: int, layouts: list, refs: dict, tmp_path: pathlib.Path) -> None:
    spawn(_worker, (world, str(tmp_path / "pg"), layouts, refs), world)


gloo = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                          reason="torch.distributed with gloo is not available")


@pytest.mark.slow
@gloo
@pytest.mark.parametrize("world, layouts", [(2, ["fsdp", "tp", "titan_fsdp", "titan_tp", "titan_tp_full"]),
                                            (4, ["fsdp_tp", "titan_fsdp_tp"])], ids=["2-ranks", "2x2-mesh"])
def test_sharded_layouts_equal_one_device(tmp_path, world, layouts):
    """FSDP2 and TP over 2 ranks (wqkv's rows, grouped per KV head, split between them), FSDP2 and TP
    through torchtitan's own ``parallelize_llama`` (both DTensor backends; its RoPE tables become
    DTensor buffers), FSDP x TP on a 2x2 mesh (``_StridedShard``), by hand and by ``parallelize_llama``:
    the gathered parameters are the one-device bytes."""
    ref_path = str(tmp_path / "ref.pt")
    torch.save(folder_as_loaded(tmp_path, "float32"), ref_path)
    _spawn(world, layouts, dict.fromkeys(layouts, ref_path), tmp_path)


@pytest.mark.slow
@gloo
def test_expert_parallel_through_torchtitans_own_parallelize_equals_one_device(tmp_path, tmp_path_factory):
    """Expert parallel over 2 ranks, by torchtitan's own ``parallelize_qwen3`` and
    ``parallelize_deepseekv3`` (``expert_parallel_degree=2``): each rank holds half of every
    ``GroupedExperts`` tensor (``Shard(0)`` on the ``ep`` mesh dim) and fills only those experts; the
    gathered parameters are the folder's bytes as torchtitan loads them on one device."""
    refs = {"titan_ep_qwen3_moe": _folder_reference(tmp_path_factory, "debugmodel_moe", QWEN3_MOE),
            "titan_ep_deepseek_v3": _folder_reference(tmp_path_factory, "deepseek_v3", DEEPSEEK_V3)}
    _spawn(2, list(refs), refs, tmp_path)


@pytest.mark.parametrize("flavor", ["llama3", "deepseek_v3"])
def test_a_pipeline_stage_holds_the_whole_models_bytes(tmp_path, tmp_path_factory, flavor):
    """Each stage of torchtitan's own pipeline split (what ``pipeline_llm`` runs per stage, without a
    PP mesh: ``_generate_llm_fqn_per_model_part`` then ``_split_module``, which deletes the other
    layers from the ModuleDict and sets ``tok_embeddings``/``norm``/``lm_head`` to None on the stages
    without them), filled with ``partial=True``: its tensors are the whole model's bytes, and
    ``summary.missing`` counts the stored tensors it lacks (torchtitan's own ``to_hf`` of the stage says
    which it stores). Without ``partial=True`` a stage is refused before anything is written."""
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part, _split_module

    from modelinit_server.training.torchtitan_layout import _adapter

    if flavor == "llama3":
        whole, hf, ref = meta_model(), HF, folder_as_loaded(tmp_path, "float32")
    else:  # a dense first layer, then MoE layers: the stages differ in structure
        whole, hf = flavor_model("deepseek_v3"), DEEPSEEK_V3
        ref = torch.load(_folder_reference(tmp_path_factory, "deepseek_v3", DEEPSEEK_V3))
    stored = len(_adapter(whole).to_hf(whole.state_dict()))  # the folder's tensors
    stages = _generate_llm_fqn_per_model_part(2, len(whole.layers))
    seen: set[str] = set()
    fingerprints: set[str] = set()
    for modules in stages:
        stage = _split_module(whole, modules)
        lacks = stored - len(_adapter(stage).to_hf(stage.state_dict()))
        assert lacks > 0 and (stage.tok_embeddings is None) != (stage.lm_head is None)
        stage.to_empty(device="cpu")
        for p in stage.parameters():
            p.detach().fill_(float("nan"))
        with pytest.raises(ValueError, match=rf"^module: it lacks {lacks} tensor\(s\) of the spec, e\.g\. '[^']+'; a "
                                             r"pipeline stage is filled with partial=True$"):
            modelinit.init_module_(stage, seed=SEED, spec=hf)
        assert all(p.isnan().all() for p in stage.parameters())  # refused: nothing written
        summary = modelinit.init_module_(stage, seed=SEED, spec=hf, partial=True)
        got = {n: p.detach() for n, p in stage.named_parameters()}
        assert [n for n in got if not same_bytes(got[n], ref[n])] == []
        assert summary.missing == lacks
        fingerprints.add(summary.fingerprint)  # the whole model's plan, whichever stage
        seen |= set(got)
    assert seen == set(ref) and len(fingerprints) == 1  # the stages together hold the whole model


def test_a_torchtitan_model_needs_a_spec_it_matches():
    """Without ``spec`` a model of a family modelinit derives no Hugging Face config for (gpt-oss) is
    refused (issue 43: Llama 3, Qwen3 and DeepSeek-V3 derive theirs, test_torchtitan_config.py); a
    spec the model does not match is refused naming the first tensor that differs."""
    import dataclasses

    from torchtitan.models.gpt_oss import model_registry

    config = model_registry("debugmodel", attn_backend="flex").model
    with torch.device("meta"):
        gpt_oss = dataclasses.replace(config, layers=config.layers[:1]).build()
    with pytest.raises(ValueError, match=r"^module: GptOssModel's config \(GptOssModel\.Config\) is not one modelinit "
                                         r"derives a Hugging Face config from \(llama3, qwen3, deepseek_v3\); give the "
                                         r"Hugging Face config this model corresponds to: init_module_\(model, spec=\.\.\.\)$"):
        modelinit.init_module_(gpt_oss.to_empty(device="cpu"), seed=SEED)
    model = meta_model().to_empty(device="cpu")
    with pytest.raises(ValueError, match=r"stores 'model\.layers\.0\.mlp\.gate_proj\.weight' as \[768, 256\], the spec has "
                                         r"\[512, 256\]: the model does not match the spec"):
        modelinit.init_module_(model, seed=SEED, spec={**HF, "intermediate_size": 512})
    with pytest.raises(ValueError, match=r"^module: torchtitan's Llama3Model holds 'model\.layers\.1\.self_attn\.q_proj\.weight', "
                                         r"which the spec \(LlamaForCausalLM\) does not have: give the Hugging Face config"):
        modelinit.init_module_(model, seed=SEED, spec={**HF, "num_hidden_layers": 1})
    # what differs, with both values, not only the first tensor (the model derives its own config to compare)
    with pytest.raises(ValueError, match=r"the spec differs from the model's own config in num_hidden_layers: 3 in the "
                                         r"spec, 2 in the model$"):
        modelinit.init_module_(model, seed=SEED, spec={**HF, "num_hidden_layers": 3})
    with pytest.raises(ValueError, match=r"the spec differs from the model's own config in tie_word_embeddings: True in "
                                         r"the spec, False in the model$"):
        modelinit.init_module_(model, seed=SEED, spec={**HF, "tie_word_embeddings": True})
    with pytest.raises(ValueError, match=r"^spec: Linear is not a model of a training stack"):
        modelinit.init_module_(torch.nn.Linear(4, 4), seed=SEED, spec=HF)


def test_only_the_layers_are_probed_when_they_locate_every_copy(monkeypatch):
    """The copies torchtitan's adapter makes (q, k, v out of the fused ``wqkv``) are located on
    index probes of one layer; the embedding (outside the layers, the largest tensor) is not
    probed: a probe costs its whole size on every rank, whatever the shard."""
    from modelinit_server.training import torchtitan_layout

    probed: list[list[str]] = []
    real = torchtitan_layout._probed

    def spy(twin, adapter, params, names, copies):
        probed.append(list(names))
        return real(twin, adapter, params, names, copies)

    monkeypatch.setattr(torchtitan_layout, "_probed", spy)
    modelinit.init_module_(meta_model().to_empty(device="cpu"), seed=SEED, spec=HF)
    assert probed == [["layers.0.attention.qkv_linear.wqkv.weight"]]
