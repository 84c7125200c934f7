"""torchtitan models the torchtitan tests share: the test's Llama 3 (torchtitan's debugmodel cut to
2 layers with 4 KV heads) and its Hugging Face config, Qwen3 dense and MoE and DeepSeek-V3 debug
flavors cut to 2-3 layers with theirs, and the Hugging Face folder of (config, seed, policy) loaded
the way torchtitan loads a checkpoint (its adapter's ``from_hf``, then the model's own load hooks).

torchtitan must be importable: the tests call ``stacks.install_torchtitan()`` first.
"""
from __future__ import annotations

import pathlib

import safetensors.torch
import torch

import modelinit
from tests.support.stacks import TORCHTITAN_HF

#: The seed every torchtitan test fills with.
SEED = 7
#: torchtitan's llama3 "debugmodel" flavor (dim 256, 6 layers, 16 heads, FFN 768, vocabulary 2048), made
#: smaller where the test's speed asks (2 layers, 4 KV heads: grouped-query attention).
HF = TORCHTITAN_HF


def titan_config():
    """The debugmodel's config with the test's sizes (2 layers, 4 KV heads)."""
    import dataclasses

    from torchtitan.models.llama3 import model_registry

    config = model_registry("debugmodel", attn_backend="flex").model
    layers = [dataclasses.replace(layer, attention=with_kv_heads(layer.attention, 4)) for layer in config.layers[:2]]
    return dataclasses.replace(config, layers=layers)


def with_kv_heads(attention, n_kv_heads: int):
    """torchtitan's attention config with ``n_kv_heads`` KV heads, its fused ``wqkv`` resized to match."""
    import dataclasses

    qkv = attention.qkv_linear
    fused = dataclasses.replace(qkv.wqkv, out_features=(attention.n_heads + 2 * n_kv_heads) * (qkv.head_dim or 16))
    return dataclasses.replace(attention, n_kv_heads=n_kv_heads,
                               qkv_linear=dataclasses.replace(qkv, n_kv_heads=n_kv_heads, wqkv=fused))


def meta_model():
    """The test's Llama 3 on the meta device."""
    with torch.device("meta"):
        return titan_config().build()


def folder_as_loaded(tmp_path: pathlib.Path, dtype: str, policy=None) -> dict:
    """The folder of (HF, SEED, policy) in ``dtype``, loaded the way torchtitan loads a Hugging Face
    checkpoint: its adapter's ``from_hf``, then the model's own load hooks: the parameters."""
    from torchtitan.models.llama3.state_dict_adapter import Llama3StateDictAdapter

    out = tmp_path / f"hf-{dtype}-{policy}"
    with modelinit.Client() as c:
        c.init_model(HF, seed=SEED, out_dir=out, dtype=dtype, policy=policy)
    files = {}
    for f in out.glob("*.safetensors"):
        files.update(safetensors.torch.load_file(f))
    model = meta_model().to_empty(device="cpu").to(getattr(torch, dtype))
    model.load_state_dict(Llama3StateDictAdapter(model.config, None).from_hf(files))
    return {n: p.detach().clone() for n, p in model.named_parameters()}


#: Qwen3 dense (tied embeddings, q/k norms, head_dim 128 over a 256 model) and MoE (GroupedExperts' stacked
#: w1_EFD/w2_EDF/w3_EFD, a router), torchtitan's debug flavors cut to 2 layers.
QWEN3 = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 256, "head_dim": 128,
         "num_hidden_layers": 2, "num_attention_heads": 16, "num_key_value_heads": 8, "intermediate_size": 3072,
         "vocab_size": 2048, "tie_word_embeddings": True, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6}
QWEN3_MOE = {**QWEN3, "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "tie_word_embeddings": False,
             "intermediate_size": 768, "moe_intermediate_size": 768, "num_experts": 64, "num_experts_per_tok": 8,
             "decoder_sparse_step": 1, "mlp_only_layers": []}

#: DeepSeek-V3's debug flavor cut to 3 layers: MLA (kv_lora_rank 512, no q LoRA), a dense first layer, then MoE
#: layers with 2 shared experts and a router whose bias the Hugging Face layout stores (e_score_correction_bias).
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 256,
               "num_hidden_layers": 3, "num_attention_heads": 16, "num_key_value_heads": 16, "q_lora_rank": None,
               "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
               "intermediate_size": 1024, "moe_intermediate_size": 256, "n_routed_experts": 8, "n_shared_experts": 2,
               "num_experts_per_tok": 3, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "vocab_size": 2048,
               "tie_word_embeddings": False, "max_position_embeddings": 16384, "rms_norm_eps": 1e-5}


def flavor_model(flavor: str, built: bool = True):
    """The flavor's model on the meta device (its config when ``built`` is False)."""
    import dataclasses

    if flavor == "deepseek_v3":
        from torchtitan.models.deepseek_v3 import model_registry

        config = model_registry("debugmodel", attn_backend="flex").model
        config = dataclasses.replace(config, layers=config.layers[:3])
    else:
        from torchtitan.models.qwen3 import model_registry

        config = model_registry(flavor, attn_backend="flex").model
        config = dataclasses.replace(config, layers=config.layers[:2])
    if not built:
        return config
    with torch.device("meta"):
        return config.build()


#: torchtitan's own parallelize function and sharding-config setter per model family.
TITAN = {"llama3": ("parallelize_llama", "set_llama3_sharding_config"),
         "qwen3": ("parallelize_qwen3", "set_qwen3_sharding_config"),
         "deepseek_v3": ("parallelize_deepseekv3", "set_deepseek_v3_sharding_config")}


def titan_parallelized(config, world: int, backend: str = "partial_dtensor", **degrees):
    """A model of ``config`` built on meta and parallelized by its family's own parallelize function,
    as torchtitan's trainer does: ``degrees`` are ParallelismConfig's (tensor_parallel_degree=2, ...).
    The trainer first calls ``config.update_from_config``, which sets each module's sharding config
    (without one, ``Module.parallelize`` shards nothing: no TP, no EP); that method imports torchtitan's
    Trainer (torchdata, not installed here), so the two calls it makes are made here."""
    import importlib

    import torchtitan.distributed.parallel_dims as parallel_dims
    from torchtitan.config.configs import CompileConfig, ParallelismConfig, TrainingConfig

    family = ".".join(type(config).__module__.split(".")[:3])  # torchtitan.models.<family>
    parallelize, set_sharding = TITAN[family.rpartition(".")[2]]
    par = ParallelismConfig(data_parallel_shard_degree=-1, spmd_backend=backend, **degrees)
    ep = {} if family.endswith("llama3") else {"enable_ep": par.expert_parallel_degree > 1}
    getattr(importlib.import_module(f"{family}.sharding"), set_sharding)(
        config, enable_sp=par.enable_sequence_parallel, **ep)
    with torch.device("meta"):
        model = config.build()
    parallel_dims.device_type = "cpu"  # it takes the machine's accelerator otherwise
    getattr(importlib.import_module(family), parallelize)(
        model, parallel_dims=parallel_dims.ParallelDims.from_config(par, world), training=TrainingConfig(),
        parallelism=par, compile_config=CompileConfig(), ac_config=None, dump_folder="")
    return model
