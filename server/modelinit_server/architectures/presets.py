"""Preset architectures: the public hub ``config.json`` of well-known checkpoints.

Values are copied from the hub configs, keeping every field that shapes the model or that a
loader reads (sizes, heads, positions, eps, RoPE, special tokens, tying). Left out: ``torch_dtype``
/ ``transformers_version`` (the writer adds the dtype) and keys no current loader reads
(``n_ctx``, ``gradient_checkpointing``, ``position_embedding_type``, ``task_specific_params``, ...).
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

from .frozen import freeze
from .hub_configs import HUB_CONFIGS


def _bert(hidden: int, layers: int, heads: int, intermediate: int) -> dict[str, Any]:
    """google-bert/bert-{base,large}-uncased."""
    return {
        "architectures": ["BertForMaskedLM"],
        "model_type": "bert",
        "attention_probs_dropout_prob": 0.1,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": intermediate,
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": 512,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "pad_token_id": 0,
        "type_vocab_size": 2,
        "use_cache": True,
        "vocab_size": 30522,
    }


def _gpt2(n_embd: int, n_layer: int, n_head: int) -> dict[str, Any]:
    """openai-community/gpt2{,-xl}."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "activation_function": "gelu_new",
        "attn_pdrop": 0.1,
        "bos_token_id": 50256,
        "embd_pdrop": 0.1,
        "eos_token_id": 50256,
        "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05,
        "n_embd": n_embd,
        "n_head": n_head,
        "n_layer": n_layer,
        "n_positions": 1024,
        "resid_pdrop": 0.1,
        "summary_activation": None,
        "summary_first_dropout": 0.1,
        "summary_proj_to_labels": True,
        "summary_type": "cls_index",
        "summary_use_proj": True,
        "vocab_size": 50257,
    }


def _llama(**fields: Any) -> dict[str, Any]:
    """A Llama-architecture hub config: the fields every Llama checkpoint states, plus ``fields``."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "use_cache": True,
        **fields,
    }


_PRESETS: dict[str, dict[str, Any]] = {
    "bert-base-uncased": _bert(hidden=768, layers=12, heads=12, intermediate=3072),
    "bert-large-uncased": _bert(hidden=1024, layers=24, heads=16, intermediate=4096),
    # FacebookAI/roberta-base
    "roberta-base": {
        "architectures": ["RobertaForMaskedLM"],
        "model_type": "roberta",
        "attention_probs_dropout_prob": 0.1,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": 768,
        "initializer_range": 0.02,
        "intermediate_size": 3072,
        "layer_norm_eps": 1e-05,
        "max_position_embeddings": 514,
        "num_attention_heads": 12,
        "num_hidden_layers": 12,
        "pad_token_id": 1,
        "type_vocab_size": 1,
        "vocab_size": 50265,
    },
    "gpt2": _gpt2(n_embd=768, n_layer=12, n_head=12),
    "gpt2-xl": _gpt2(n_embd=1600, n_layer=48, n_head=25),
    # TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T
    "tinyllama-1.1b": _llama(
        bos_token_id=1,
        eos_token_id=2,
        hidden_size=2048,
        intermediate_size=5632,
        max_position_embeddings=2048,
        num_attention_heads=32,
        num_hidden_layers=22,
        num_key_value_heads=4,
        rms_norm_eps=1e-05,
        rope_theta=10000.0,
        vocab_size=32000,
    ),
    # meta-llama/Llama-2-7b-hf
    "llama-2-7b": _llama(
        bos_token_id=1,
        eos_token_id=2,
        hidden_size=4096,
        intermediate_size=11008,
        max_position_embeddings=4096,
        num_attention_heads=32,
        num_hidden_layers=32,
        num_key_value_heads=32,
        rms_norm_eps=1e-05,
        rope_theta=10000.0,
        vocab_size=32000,
    ),
    # meta-llama/Meta-Llama-3-8B
    "llama-3-8b": _llama(
        bos_token_id=128000,
        eos_token_id=128001,
        hidden_size=4096,
        intermediate_size=14336,
        max_position_embeddings=8192,
        num_attention_heads=32,
        num_hidden_layers=32,
        num_key_value_heads=8,
        rms_norm_eps=1e-05,
        rope_theta=500000.0,
        vocab_size=128256,
    ),
    # meta-llama/Meta-Llama-3-70B
    "llama-3-70b": _llama(
        bos_token_id=128000,
        eos_token_id=128001,
        hidden_size=8192,
        intermediate_size=28672,
        max_position_embeddings=8192,
        num_attention_heads=64,
        num_hidden_layers=80,
        num_key_value_heads=8,
        rms_norm_eps=1e-05,
        rope_theta=500000.0,
        vocab_size=128256,
    ),
    # mistralai/Mistral-7B-v0.1
    "mistral-7b": {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "sliding_window": 4096,
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": 32000,
    },
    # Qwen/Qwen2.5-7B
    "qwen2.5-7b": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "hidden_act": "silu",
        "hidden_size": 3584,
        "initializer_range": 0.02,
        "intermediate_size": 18944,
        "max_position_embeddings": 131072,
        "max_window_layers": 28,
        "num_attention_heads": 28,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 131072,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 152064,
    },
    **HUB_CONFIGS,
}
#: Preset name -> its config document, read-only (:mod:`.frozen`): a change raises ``TypeError`` where
#: it is attempted, so no caller can alter a preset for the next one; from_preset and from_config copy.
PRESETS: Mapping[str, Mapping[str, Any]] = MappingProxyType({name: freeze(doc) for name, doc in _PRESETS.items()})

#: Classes whose extra tensors a hub checkpoint holds beyond its config's class: the hub files of
#: bert-base/large-uncased were saved from BertForPreTraining (pooler and next-sentence head) and
#: roberta-base's carries RobertaModel's pooler. Their tensors are added, so that every class of
#: the family finds what the hub checkpoint would give it (docs/policies.md, "Presets").
PRESET_EXTRAS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "bert-base-uncased": ("BertForPreTraining",),
    "bert-large-uncased": ("BertForPreTraining",),
    "roberta-base": ("RobertaModel",),
})
