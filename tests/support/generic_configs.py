"""Tiny configs of many transformers families, for tests/server/architectures/test_generic.py (and ``HANDMADE``, the
configs the census' shrink cannot make buildable, for the computed tensors' tests).

Small enough to build, write and load in well under a second each, large enough (width 64,
vocab 256) that every drawn tensor has enough elements for a statistical check of its std.
Each family keeps the features that make it different: grouped KV heads, MoE experts (fused in
memory, stored per expert), multi-latent attention, relative attention biases, patch
convolutions, padding rows, tied embeddings.
"""
from __future__ import annotations

from typing import Any

COMMON: dict[str, Any] = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4)

#: model_type -> a config.json document (``model_type`` included).
TINY: dict[str, dict[str, Any]] = {
    "bert": dict(COMMON, max_position_embeddings=64, type_vocab_size=2, pad_token_id=0),
    "roberta": dict(COMMON, max_position_embeddings=66, type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2),
    "gpt2": dict(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=64),
    "llama": dict(COMMON, num_key_value_heads=2, pad_token_id=0, tie_word_embeddings=False),
    "mistral": dict(COMMON, num_key_value_heads=2, tie_word_embeddings=False),
    "qwen2": dict(COMMON, num_key_value_heads=2, tie_word_embeddings=True),
    "gemma": dict(COMMON, num_key_value_heads=2, head_dim=16, pad_token_id=0),
    "gemma2": dict(COMMON, num_key_value_heads=2, head_dim=16, pad_token_id=0),
    "phi3": dict(COMMON, num_key_value_heads=2, pad_token_id=0),
    "qwen3": dict(COMMON, num_key_value_heads=2, head_dim=16),
    "mixtral": dict(COMMON, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(COMMON, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=48),
    "deepseek_v3": dict(COMMON, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                        n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8,
                        qk_nope_head_dim=8, v_head_dim=16, n_group=2, topk_group=1),
    "olmo2": dict(COMMON, num_key_value_heads=2),
    "t5": dict(vocab_size=256, d_model=64, d_kv=16, d_ff=96, num_layers=2, num_heads=4),
    "bart": dict(vocab_size=256, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96, max_position_embeddings=64),
    "vit": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, image_size=32, patch_size=8),
    "gpt_neox": dict(COMMON),
    "falcon": dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4),
    "starcoder2": dict(COMMON, num_key_value_heads=2),
}
TINY = {model_type: dict(config, model_type=model_type) for model_type, config in TINY.items()}

#: The families the server builds by hand (the fast path) and their classes.
BUILT_IN: dict[str, tuple[str, ...]] = {
    "bert": ("BertForMaskedLM", "BertModel", "BertForPreTraining"),
    "roberta": ("RobertaForMaskedLM", "RobertaModel"),
    "gpt2": ("GPT2LMHeadModel", "GPT2Model"),
    "llama": ("LlamaForCausalLM", "LlamaModel"),
    "mistral": ("MistralForCausalLM", "MistralModel"),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Model"),
}

#: Head classes of built-in families that only the generic path builds.
HEADS: dict[str, tuple[str, str]] = {
    "BertForSequenceClassification": ("bert", "bert"),
    "BertForPreTraining": ("bert", "bert"),
    "RobertaForTokenClassification": ("roberta", "roberta"),
    "LlamaForSequenceClassification": ("llama", "model"),
}
"""class -> (model_type, base_model_prefix)."""

#: (test id, model_type, class or "" for the config's usual class): every family's usual class,
#: plus task heads of the built-in families.
CASES: list[tuple[str, str, str]] = [(mt, mt, "") for mt in TINY] + [(cls, mt, cls) for cls, (mt, _) in HEADS.items()]

#: Configs the census' shrink cannot make buildable (their widths are tied by validators).
HANDMADE = {
    "mamba2": dict(model_type="mamba2", vocab_size=256, hidden_size=64, expand=2, num_heads=8, head_dim=16, state_size=16,
                   n_groups=1, num_hidden_layers=2, chunk_size=32, architectures=["Mamba2ForCausalLM"]),
    "nemotron_h": dict(model_type="nemotron_h", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                       hybrid_override_pattern="M-M*", num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, n_groups=1,
                       architectures=["NemotronHForCausalLM"]),
}
